"""Cost and daily budgets (docs/design.md §14): prices, the run's cost, the spend ledger, the
check before each provider call and the ``budget_exhausted`` ending. Both databases."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import IntegrityError, connection, transaction
from django.test import override_settings

from agentruns import budgets
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    SpendDay,
    SpendScope,
    Status,
    TerminationReason,
)
from agentruns.services.runs import run_decide, run_start_sync
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.runtime import DECIDE

pytestmark = pytest.mark.django_db(transaction=True)

# 1,000 prompt and 500 completion tokens per answer at 2.50 and 10.00 per million: 0.0075.
USAGE = {"prompt_tokens": 1000, "completion_tokens": 500}
CALL_COST = Decimal("0.007500")


def priced(**fields) -> AgentConfiguration:
    defaults = {
        "price_per_million_prompt_tokens": Decimal("2.50"),
        "price_per_million_completion_tokens": Decimal("10.00"),
        "script": [
            {"tool_calls": [{"name": "list_notes"}], "usage": USAGE},
            {"tool_calls": [{"name": "list_notes"}], "usage": USAGE},
            {"content": "done", "usage": USAGE},
        ],
    }
    return AgentConfigurationFactory(**{**defaults, **fields})


def llm_events(run: AgentRun) -> list[dict]:
    return [
        e.payload
        for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).order_by("sequence")
    ]


def spend(scope: str, key: int) -> SpendDay | None:
    return SpendDay.objects.filter(scope=scope, key=key).first()


# --- What a call costs ----------------------------------------------------------------------


def test_call_cost_from_prices_and_usage():
    config = AgentConfiguration(
        price_per_million_prompt_tokens=Decimal("2.5"),
        price_per_million_completion_tokens=Decimal("10"),
    )
    assert budgets.call_cost(config, USAGE) == budgets.Priced(CALL_COST, usage_known=True)
    # One price unset counts as 0; neither set: not priced at all.
    config.price_per_million_completion_tokens = None
    assert budgets.call_cost(config, USAGE).cost == Decimal("0.0025")
    assert budgets.call_cost(AgentConfiguration(), USAGE) is None


def test_a_provider_without_usage_costs_zero_and_says_so():
    config = AgentConfiguration(price_per_million_prompt_tokens=Decimal("3"))
    assert budgets.call_cost(config, {}) == budgets.Priced(Decimal("0"), usage_known=False)


def test_huge_token_counts_and_prices_are_capped_not_overflowed():
    config = AgentConfiguration(
        price_per_million_prompt_tokens=Decimal("999999.999999"),
        price_per_million_completion_tokens=Decimal("999999.999999"),
    )
    huge = {"prompt_tokens": 2**31 - 1, "completion_tokens": 2**31 - 1}
    assert budgets.call_cost(config, huge).cost == budgets.MAX_COST


# --- The run's cost ---------------------------------------------------------------------------


def test_a_priced_run_records_each_answers_cost_and_its_total():
    user = UserFactory()
    config = priced()
    result = run_start_sync(configuration=config, prompt="go", initiator=user)
    run = result.run
    assert run.status == Status.COMPLETED
    answers = llm_events(run)
    assert [a["cost"] for a in answers] == [str(CALL_COST)] * 3
    assert run.cost == CALL_COST * 3
    assert run.prompt_tokens == 3000
    for scope, key in ((SpendScope.CONFIGURATION, config.pk), (SpendScope.USER, user.pk)):
        row = spend(scope, key)
        assert row is not None and row.amount == CALL_COST * 3 and row.calls == 3
        assert row.largest == CALL_COST


def test_an_unpriced_run_costs_nothing_and_writes_no_ledger():
    config = AgentConfigurationFactory(script=[{"content": "done", "usage": USAGE}])
    run = run_start_sync(configuration=config, prompt="go").run
    assert run.cost == 0
    assert "cost" not in llm_events(run)[0]
    assert not SpendDay.objects.exists()


def test_unknown_usage_is_charged_zero_and_counted():
    # The scripted provider estimates counts it is not given; "usage": null reports none.
    config = priced(script=[{"content": "done", "usage": None}])
    run = run_start_sync(configuration=config, prompt="go").run
    (answer,) = llm_events(run)
    assert answer["cost"] == "0.000000" and answer["usage_unknown"] is True
    row = spend(SpendScope.CONFIGURATION, config.pk)
    assert row.amount == 0 and row.unknown_usage_calls == 1


def test_the_cost_is_kept_across_a_pause_for_approval(probes):
    user = UserFactory(permissions=[DECIDE])
    config = priced(
        script=[
            {"tool_calls": [{"name": "probe_write", "arguments": {"value": "t"}}], "usage": USAGE},
            {"content": "done", "usage": USAGE},
        ]
    )
    waiting = run_start_sync(configuration=config, prompt="go", initiator=user).run
    assert waiting.status == Status.WAITING_FOR_APPROVAL
    assert waiting.cost == CALL_COST
    digest = waiting.pending_turn["turn_digest"]
    decided = run_decide(
        run_uuid=waiting.uuid, approved=True, turn_digest=digest, actor=user, mode="inline"
    )
    run = AgentRun.objects.get(pk=waiting.pk)
    assert decided is not None and run.status == Status.COMPLETED
    assert run.cost == CALL_COST * 2


# --- Budgets ----------------------------------------------------------------------------------


def test_a_configuration_over_its_budget_fails_before_calling_the_model():
    config = priced(daily_budget=Decimal("0.01"))  # room for two answers (0.0075 each)
    run = run_start_sync(configuration=config, prompt="go").run
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    # The first call was admitted at 0; the second (0.0075 < 0.01) with 0.0075 reserved; the
    # third found 0.015 spent.
    assert len(llm_events(run)) == 2
    assert run.cost == CALL_COST * 2
    event = AgentRunEvent.objects.get(run=run, kind=EventKind.BUDGET)
    assert event.payload["budget"] == "configuration"
    assert event.payload["spend"] == "0.015000" and event.payload["limit"] == "0.010000"
    assert event.payload["currency"] == "USD"
    assert run.error["type"] == "BudgetExhausted"
    # The refusal made no call: the request event was never written for it.
    kinds = list(
        AgentRunEvent.objects.filter(run=run).order_by("sequence").values_list("kind", flat=True)
    )
    assert kinds[-1] == EventKind.BUDGET and kinds.count(EventKind.REQUEST) == 2
    assert spend(SpendScope.CONFIGURATION, config.pk).amount == CALL_COST * 2


@override_settings(
    AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "0.0075", "COST_CURRENCY": "EUR"}
)
def test_the_user_budget_caps_an_initiator_across_configurations():
    user, other = UserFactory(), UserFactory()
    first = run_start_sync(
        configuration=priced(script=[{"content": "a", "usage": USAGE}]), prompt="go", initiator=user
    ).run
    assert first.status == Status.COMPLETED
    second = run_start_sync(configuration=priced(), prompt="go", initiator=user).run
    assert second.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert llm_events(second) == []
    payload = AgentRunEvent.objects.get(run=second, kind=EventKind.BUDGET).payload
    assert payload["budget"] == "user" and payload["key"] == user.pk
    assert payload["currency"] == "EUR"
    # Another initiator, and a run without one, are not capped by this user's spend.
    assert (
        run_start_sync(
            configuration=priced(script=[{"content": "a", "usage": USAGE}]),
            prompt="go",
            initiator=other,
        ).run.status
        == Status.COMPLETED
    )
    assert run_start_sync(configuration=priced(), prompt="go").run.status == Status.COMPLETED


@override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "0.0075"})
def test_a_refusal_by_one_budget_holds_nothing_on_the_other():
    user = UserFactory()
    config = priced(daily_budget=Decimal("1"), script=[{"content": "a", "usage": USAGE}])
    assert run_start_sync(configuration=config, prompt="go", initiator=user).run.cost == CALL_COST
    refused = run_start_sync(configuration=config, prompt="go", initiator=user).run
    assert refused.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    payload = AgentRunEvent.objects.get(run=refused, kind=EventKind.BUDGET).payload
    assert payload["budget"] == "user"
    # The configuration's row admitted the call, but the user's refused it: nothing held.
    assert spend(SpendScope.CONFIGURATION, config.pk).amount == CALL_COST
    assert spend(SpendScope.USER, user.pk).amount == CALL_COST


def test_a_worker_ends_an_over_budget_run_without_a_retry():
    from agentruns.services.runs import run_enqueue, run_process_queued

    config = priced(daily_budget=Decimal("0.005"))
    queued = run_enqueue(configuration=config, prompt="go")
    result = run_process_queued(run_uuid=queued.uuid)
    run = result.run
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert run.requeue_count == 0 and run.cost == CALL_COST
    assert len(llm_events(run)) == 1


def test_a_zero_budget_admits_nothing():
    config = priced(daily_budget=Decimal("0"))
    run = run_start_sync(configuration=config, prompt="go").run
    assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert llm_events(run) == []


def test_a_waiting_run_is_not_touched_until_it_continues(probes):
    user = UserFactory(permissions=[DECIDE])
    config = priced(
        daily_budget=Decimal("1"),
        script=[
            {"tool_calls": [{"name": "probe_write", "arguments": {"value": "t"}}], "usage": USAGE},
            {"content": "done", "usage": USAGE},
        ],
    )
    waiting = run_start_sync(configuration=config, prompt="go", initiator=user).run
    assert waiting.status == Status.WAITING_FOR_APPROVAL
    # The budget is spent meanwhile (by other runs): the waiting run stays waiting.
    SpendDay.objects.filter(scope=SpendScope.CONFIGURATION, key=config.pk).update(
        amount=Decimal("5")
    )
    assert AgentRun.objects.get(pk=waiting.pk).status == Status.WAITING_FOR_APPROVAL
    # Approved, it continues: the tool runs, and the next provider call is refused.
    run_decide(
        run_uuid=waiting.uuid,
        approved=True,
        turn_digest=waiting.pending_turn["turn_digest"],
        actor=user,
        mode="inline",
    )
    run = AgentRun.objects.get(pk=waiting.pk)
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL).count() == 1
    assert len(llm_events(run)) == 1


def test_a_failed_call_gives_its_reservation_back():
    config = priced(daily_budget=Decimal("1"), script=[{"content": "a", "usage": USAGE}])
    run_start_sync(configuration=config, prompt="go")
    row = spend(SpendScope.CONFIGURATION, config.pk)
    assert row.largest == CALL_COST
    failed = run_start_sync(
        configuration=config, prompt="go", options={"script": [{"error": "fatal"}]}
    ).run
    assert failed.termination_reason == TerminationReason.PROVIDER_FAILED
    # The first run's call is the only spend: the failed call's reservation was released.
    row.refresh_from_db()
    assert row.amount == CALL_COST and row.calls == 1


def test_the_check_fails_closed_when_it_cannot_be_made():
    config = priced(daily_budget=Decimal("1"))
    table = SpendDay._meta.db_table
    with connection.cursor() as cursor:  # the ledger is gone: the check cannot be made
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        result = run_start_sync(configuration=config, prompt="go")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")
    assert result.outcome == "failed"
    assert llm_events(AgentRun.objects.get(pk=result.run.pk)) == []
    assert AgentRun.objects.get(pk=result.run.pk).status == Status.RUNNING  # the reaper's now


# --- An answer and its charge: both or neither ------------------------------------------------


@pytest.fixture
def ledger_refuses_charges():
    """The database refuses every charge (a write adding a call to a ``SpendDay`` row) with a
    trigger; a reservation (``calls`` unchanged) still passes. Dropped afterwards."""
    table = SpendDay._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION refuse_charge() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the ledger refuses the charge'; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER refuse_charge_insert BEFORE INSERT ON {table} FOR EACH ROW "
                "WHEN (NEW.calls > 0) EXECUTE FUNCTION refuse_charge()"
            )
            cursor.execute(
                f"CREATE TRIGGER refuse_charge_update BEFORE UPDATE ON {table} FOR EACH ROW "
                "WHEN (NEW.calls > OLD.calls) EXECUTE FUNCTION refuse_charge()"
            )
        else:
            for event, when in (("INSERT", "NEW.calls > 0"), ("UPDATE", "NEW.calls > OLD.calls")):
                cursor.execute(
                    f"CREATE TRIGGER refuse_charge_{event.lower()} BEFORE {event} ON {table} "
                    f"WHEN {when} BEGIN SELECT RAISE(ABORT, 'the ledger refuses the charge'); END"
                )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for event in ("insert", "update"):
                on = f" ON {table}" if connection.vendor == "postgresql" else ""
                cursor.execute(f"DROP TRIGGER refuse_charge_{event}{on}")
            if connection.vendor == "postgresql":
                cursor.execute("DROP FUNCTION refuse_charge()")


#: A first answer of each kind, and the write that records it: a read turn (the boundary before
#: the read runs), a write turn (the suspend for approval), the final answer (the settle).
ANSWERS = {
    "read turn": {"tool_calls": [{"name": "probe_read", "arguments": {"value": "r"}}]},
    "write turn": {"tool_calls": [{"name": "probe_create", "arguments": {"value": "w"}}]},
    "final answer": {"content": "done"},
}


@pytest.mark.parametrize("budget", [None, Decimal("1")], ids=["unbudgeted", "budgeted"])
@pytest.mark.parametrize("answer", ANSWERS)
def test_an_answer_whose_charge_the_database_refuses_is_not_recorded(
    probes, ledger_refuses_charges, answer, budget
):
    """The charge is written in the transaction that records the answer: refused, the answer is
    not recorded either — no ``llm`` event, no cost, no spend, the run not advanced past the
    request (the reaper resumes it from there and the model is asked again). Nothing of the
    turn ran."""
    config = priced(
        daily_budget=budget,
        script=[{**ANSWERS[answer], "usage": USAGE}, {"content": "done", "usage": USAGE}],
    )
    user = UserFactory()

    result = run_start_sync(configuration=config, prompt="go", initiator=user)

    assert result.outcome == "failed" and result.detail == {"error": "state_write_failed"}
    run = AgentRun.objects.get(pk=result.run.pk)
    assert llm_events(run) == [], "the answer was recorded without its charge"
    assert run.cost == 0 and run.prompt_tokens == 0
    assert not SpendDay.objects.filter(calls__gt=0).exists()
    assert sum(row.amount for row in SpendDay.objects.all()) == 0
    # Not advanced: still running under the lease (the reaper's once it runs out), at the
    # request boundary, with no turn and nothing pending.
    assert run.status == Status.RUNNING and run.pending_turn is None
    assert run.loop_state.get("iteration", 0) == 0 and run.loop_state.get("turn") is None
    kinds = list(run.events.order_by("sequence").values_list("kind", flat=True))
    assert kinds[-1] == EventKind.REQUEST
    assert probes.seen == []


def test_a_malformed_user_budget_refuses_every_start_before_any_call():
    user = UserFactory()
    configuration = priced()
    bad = override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "ten"})
    with bad, pytest.raises(ImproperlyConfigured, match="AGENTRUNS_USER_DAILY_BUDGET"):
        run_start_sync(configuration=configuration, prompt="go", initiator=user)
    assert not AgentRun.objects.exists()


# --- Hostile values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    ["price_per_million_prompt_tokens", "price_per_million_completion_tokens", "daily_budget"],
)
def test_negative_prices_and_budgets_are_refused(field):
    config = AgentConfigurationFactory.build(slug="neg", **{field: Decimal("-1")})
    with pytest.raises(ValidationError) as refused:
        config.full_clean()
    assert field in refused.value.message_dict
    with pytest.raises(IntegrityError), transaction.atomic():
        config.save()


# --- The race for the last of a budget (real threads, PostgreSQL) --------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("racers", [2, 6])
def test_runs_racing_for_the_last_of_a_budget_overspend_by_at_most_one_call(racers):
    from tests.agentruns.support.races import race

    # Each answer costs CALL_COST; the budget has room for 6.4 of them, so the last call that
    # is admitted (spend still under the limit) overspends by at most one call, whoever races.
    budget = CALL_COST * Decimal("6.4")
    answer = {"content": "a", "usage": USAGE, "delay": 0.2}
    turn = {"tool_calls": [{"name": "list_notes"}], "usage": USAGE, "delay": 0.2}
    config = priced(daily_budget=budget, script=[turn, turn, turn, answer])
    # One call first, so the ledger knows how large a call is (what a reservation holds back).
    run_start_sync(configuration=config, prompt="warm", options={"script": [answer]})

    outcomes = race(
        [lambda: run_start_sync(configuration=config, prompt="go") for _ in range(racers)]
    )

    assert not [o.error for o in outcomes if o.error is not None]
    row = spend(SpendScope.CONFIGURATION, config.pk)
    runs = AgentRun.objects.filter(configuration=config)
    answered = AgentRunEvent.objects.filter(run__in=runs, kind=EventKind.LLM).count()
    assert row.calls == answered  # every answer charged once, nothing else
    assert row.amount == CALL_COST * answered  # no reservation left behind
    assert row.amount <= budget + CALL_COST
    assert sum((r.cost for r in runs), Decimal(0)) == row.amount
    # And the budget was really raced for: some run was refused.
    assert runs.filter(termination_reason=TerminationReason.BUDGET_EXHAUSTED).exists()


# --- Where the cost is shown ----------------------------------------------------------------


@override_settings(AGENTRUNS={**settings.AGENTRUNS, "COST_CURRENCY": "EUR"})
def test_the_api_shows_the_cost_as_a_decimal_string_with_its_currency():
    from rest_framework.test import APIClient

    user = UserFactory(permissions=[DECIDE, "agentruns.start_agentrun"])
    priced(slug="priced-api")
    client = APIClient()
    client.force_authenticate(user)
    response = client.post(
        "/api/runs/", {"configuration": "priced-api", "prompt": "go"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["cost"] == str(CALL_COST * 3) and body["currency"] == "EUR"
    listed = client.get("/api/runs/").json()["results"][0]
    assert listed["cost"] == "0.022500"
    events = client.get(f"/api/runs/{body['uuid']}/events/").json()
    events = events["results"] if isinstance(events, dict) else events
    assert [e["payload"]["cost"] for e in events if e["kind"] == "llm"] == ["0.007500"] * 3
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    run = schema["components"]["schemas"]["Run"]["properties"]
    assert run["cost"]["type"] == "string" and run["cost"]["format"] == "decimal"
    assert run["currency"]["type"] == "string"


def test_the_playground_shows_each_rounds_cost_and_the_total(client):
    from django.urls import reverse

    user = UserFactory(permissions=["playground.use_playground", DECIDE])
    run = run_start_sync(configuration=priced(), prompt="go", initiator=user).run
    client.force_login(user)
    html = client.get(reverse("playground:run", args=[run.uuid])).content.decode()
    assert html.count("cost 0.007500 USD") == 3  # each model answer
    assert "cost 0.022500 USD" in html  # the run's total


def test_the_admin_lists_the_runs_cost_with_its_currency(admin_client):
    run = run_start_sync(configuration=priced(), prompt="go").run
    html = admin_client.get("/admin/agentruns/agentrun/").content.decode()
    assert "0.022500 USD" in html
    detail = admin_client.get(f"/admin/agentruns/agentrun/{run.pk}/change/").content.decode()
    assert "0.022500 USD" in detail


def test_the_admin_refuses_a_negative_budget(admin_client):
    config = priced(slug="admin-neg")
    response = admin_client.post(
        f"/admin/agentruns/agentconfiguration/{config.pk}/change/",
        {
            "slug": "admin-neg",
            "name": "n",
            "provider": "scripted",
            "timeout_seconds": 30,
            "tools": "[]",
            "max_iterations": 10,
            "script": "[]",
            "is_active": "on",
            "daily_budget": "-5",
            "price_per_million_prompt_tokens": "1",
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert "Ensure this value is greater than or equal to 0" in response.content.decode()
    config.refresh_from_db()
    assert config.daily_budget is None


def test_the_cost_metric_per_configuration_comes_from_the_ledger(client):
    from django.db.models import Sum

    from tests.agentruns.support.metrics import samples

    first, second = priced(slug="first"), priced(slug="second")
    for config in (first, first, second):
        run_start_sync(configuration=config, prompt="go")
    client.force_login(UserFactory(is_staff=True, permissions=["agentruns.view_all_agentruns"]))
    values = samples(client)
    total = "leasehold_cost_total"
    assert values[(total, (("configuration", "first"), ("currency", "USD")))] == pytest.approx(
        float(CALL_COST * 6)
    )
    assert values[(total, (("configuration", "second"), ("currency", "USD")))] == pytest.approx(
        float(CALL_COST * 3)
    )
    # It is what the runs cost, summed from the ledger, not from the runs or their events.
    spent = AgentRun.objects.aggregate(total=Sum("cost"))["total"]
    assert spent == CALL_COST * 9


# --- What cost adds to a round (docs/design.md §6.6) --------------------------------------------


def _per_round(configuration) -> dict[str, int]:
    from collections import Counter

    from django.test.utils import CaptureQueriesContext

    def statements(rounds: int) -> Counter:
        turn = {"tool_calls": [{"name": "list_notes"}], "usage": USAGE}
        script = [turn] * rounds + [{"content": "done", "usage": USAGE}]
        with CaptureQueriesContext(connection) as captured:
            run_start_sync(configuration=configuration, prompt="go", options={"script": script})
        seen: Counter = Counter()
        for query in captured.captured_queries:
            words = query["sql"].replace('"', "").split()  # Django quotes names; statements not
            if words[0] in ("UPDATE", "SELECT"):
                table = next((w for w in words if w.startswith("agentruns_")), "?")
                seen[f"{words[0]} {table}"] += 1
            elif words[0] == "INSERT":
                seen[f"INSERT {words[2]}"] += 1
            else:
                seen[words[0]] += 1
        return seen

    two, three = statements(2), statements(3)
    return {key: three[key] - two[key] for key in three if three[key] != two[key]}


def test_cost_adds_no_statement_to_an_unpriced_round_and_one_ledger_write_to_a_priced_one():
    unpriced = _per_round(AgentConfigurationFactory())
    postgresql = connection.vendor == "postgresql"
    # A round's two boundaries: one CTE each on PostgreSQL (autocommit), an UPDATE and an
    # INSERT in a transaction each on SQLite.
    boundaries = (
        {"WITH": 2}
        if postgresql
        else {"UPDATE agentruns_agentrun": 2, "INSERT agentruns_agentrunevent": 2}
    )
    assert {key: unpriced.get(key) for key in boundaries} == boundaries
    assert not any("spendday" in key for key in unpriced)

    def added(per_round: dict[str, int]) -> dict[str, int]:
        keys = set(per_round) | set(unpriced)
        diff = {key: per_round.get(key, 0) - unpriced.get(key, 0) for key in keys}
        return {key: n for key, n in diff.items() if n}

    # Priced: the answer's boundary also charges the ledger, inside a savepoint (on PostgreSQL
    # the boundary, otherwise its own transaction in autocommit, then needs one around both).
    charge = {"INSERT agentruns_spendday": 1, "SAVEPOINT": 1, "RELEASE": 1}
    if postgresql:
        charge.update({"BEGIN": 1, "COMMIT": 1})
    assert added(_per_round(priced())) == charge
    # With a budget: the check before the call is one transaction of two statements (the
    # guarded upsert of the ledger row, the hold's insert), and the answer's write deletes the
    # hold; nothing else.
    checked = added(_per_round(priced(daily_budget=Decimal("100"), max_tokens_per_call=2000)))
    assert checked == {
        **charge,
        "INSERT agentruns_spendday": 2,
        "INSERT agentruns_spendhold": 1,
        "DELETE": 1,
        "BEGIN": charge.get("BEGIN", 0) + 1,
        "COMMIT": charge.get("COMMIT", 0) + 1,
    }


def test_the_timeline_and_the_trace_say_which_budget_stopped_the_run(client):
    from django.urls import reverse

    user = UserFactory(permissions=["playground.use_playground", DECIDE])
    config = priced(daily_budget=Decimal("0.01"))
    run = run_start_sync(configuration=config, prompt="go", initiator=user).run
    client.force_login(user)
    said = "daily budget is spent: 0.015000 of 0.010000 USD ("
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "The configuration&#x27;s " + said in timeline
    assert "The model proposed: list_notes (cost 0.007500 USD)" in timeline
    trace = client.get(reverse("playground:run", args=[run.uuid])).content.decode()
    assert "the configuration&#x27;s " + said in trace
    assert "the model was not called" in trace


@pytest.mark.postgres
def test_an_answer_that_arrives_after_a_cancel_is_recorded_and_charged():
    import threading
    import time

    from agentruns.services.runs import run_cancel

    config = priced(script=[{"content": "a", "usage": USAGE, "delay": 1.5}])
    done = threading.Event()

    def start() -> None:
        try:
            run_start_sync(configuration=config, prompt="go")
        finally:
            connection.close()
            done.set()

    threading.Thread(target=start).start()
    deadline = time.monotonic() + 20
    run = None
    while run is None and time.monotonic() < deadline:  # the call is in flight
        run = AgentRun.objects.filter(configuration=config, events__kind=EventKind.REQUEST).first()
        time.sleep(0.05)
    assert run is not None
    assert run_cancel(run_uuid=run.uuid)
    assert done.wait(30)

    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    (answer,) = llm_events(run)  # recorded before the cancel event, with its cost
    assert answer["cost"] == str(CALL_COST) and run.cost == CALL_COST
    assert spend(SpendScope.CONFIGURATION, config.pk).amount == CALL_COST


@pytest.mark.parametrize("raw", ["ten", "-1", "NaN", "Infinity"])
def test_a_malformed_user_budget_in_the_environment_is_refused_at_start(raw):
    from django.core.checks import run_checks

    from agentruns.conf import app_settings, settings_from_env

    with override_settings(AGENTRUNS=settings_from_env({"AGENTRUNS_USER_DAILY_BUDGET": raw})):
        with pytest.raises(ImproperlyConfigured, match="AGENTRUNS_USER_DAILY_BUDGET"):
            app_settings()
        reported = [m.id for m in run_checks() if "AGENTRUNS_USER_DAILY_BUDGET" in m.msg]
        assert reported and reported[0] in {"agentruns.E002", "agentruns.E003"}
    assert settings_from_env({"AGENTRUNS_USER_DAILY_BUDGET": " 12.50 "})["USER_DAILY_BUDGET"]
    assert settings_from_env({})["USER_DAILY_BUDGET"] == ""
