"""Budgets under concurrency (docs/design.md §14): runs racing for the last of a budget overspend
it by at most one call, whatever the order of prices and token counts. Each call in flight holds
its bound (``SpendHold``, ``SpendDay.reserved``); the answer's write settles the hold, a failed
call releases it, and one whose segment died lapses, charged at what it held.

Races run real threads, each on its own connection, against PostgreSQL, and against SQLite (whose
writes are serialised) where marked so; the crash points are deterministic, on both databases.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test import override_settings

from agentruns import budgets
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    SpendDay,
    SpendHold,
    SpendScope,
    Status,
    TerminationReason,
)
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import reaper
from agentruns.services.reaper import Verdict
from agentruns.services.runs import run_process_queued, run_start_sync
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.races import race

pytestmark = pytest.mark.django_db(transaction=True)

# Prices per million tokens: 0.10 and 0.20 a token.
TENTH, FIFTH = Decimal("100000"), Decimal("200000")


class ProcessDied(BaseException):
    """The process vanishing at a crash point: nothing in the runtime catches it."""


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion}


def ledger(scope: str, key: int) -> SpendDay:
    return SpendDay.objects.get(scope=scope, key=key)


def answers(runs: Any) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run__in=runs, kind=EventKind.LLM))


def cost(event: AgentRunEvent) -> Decimal:
    return Decimal(event.payload["cost"])


def assert_settled(row: SpendDay, runs: Any) -> None:
    """Every answer of ``runs`` charged once, at its cost, and nothing held any more."""
    costs = [cost(e) for e in answers(runs)]
    assert row.calls == len(costs)
    assert row.amount == sum(costs, Decimal(0))
    assert row.reserved == 0 and row.lapsed_holds == 0 and row.overruns == 0
    assert not SpendHold.objects.exists()
    for run in runs:
        assert run.cost == sum((cost(e) for e in answers([run])), Decimal(0))


def assert_refusals(runs: Any, budget: str) -> None:
    """A refused run ended failed / budget exhausted with one ``budget`` event as its last, and
    its refused call was never made (every request it recorded was answered)."""
    refused = [r for r in runs if r.termination_reason == TerminationReason.BUDGET_EXHAUSTED]
    assert refused, "nobody was refused: the budget was not raced for"
    for run in refused:
        assert run.status == Status.FAILED and run.error["type"] == "BudgetExhausted"
        stream = list(AgentRunEvent.objects.filter(run=run).order_by("sequence"))
        assert stream[-1].kind == EventKind.BUDGET
        assert stream[-1].payload["budget"] == budget
        kinds = [e.kind for e in stream]
        assert kinds.count(EventKind.REQUEST) == kinds.count(EventKind.LLM)
    for run in runs:
        assert run.status in (Status.COMPLETED, Status.FAILED)
        if run.status == Status.FAILED:
            assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED


def started(outcomes: list[Any]) -> list[AgentRun]:
    assert not [o.error for o in outcomes if o.error is not None]
    return [AgentRun.objects.get(pk=o.value.run.pk) for o in outcomes]


def priced(**fields: Any) -> AgentConfiguration:
    defaults: dict[str, Any] = {
        "price_per_million_prompt_tokens": TENTH,
        "price_per_million_completion_tokens": FIFTH,
        "tools": ["list_notes"],
    }
    return AgentConfigurationFactory(**{**defaults, **fields})


# --- The race as reported --------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("racers", [6, 20])
def test_the_reported_race_overspends_by_at_most_one_call(racers):
    # 0.10 a token, a budget of 3.00: one 1-token call, then racing runs of 10-token calls
    # (1.00 each). Holding only the largest call seen (0.10) let ten of them through (10.10).
    config = priced(
        price_per_million_completion_tokens=TENTH,
        daily_budget=Decimal(3),
        max_tokens_per_call=10,
        script=[{"content": "small", "usage": usage(1, 0)}],
    )
    run_start_sync(configuration=config, prompt="warm")
    large = [{"content": "large", "usage": usage(6, 4), "delay": 0.2}]

    runs = started(
        race(
            [
                lambda: run_start_sync(configuration=config, prompt="go", options={"script": large})
                for _ in range(racers)
            ]
        )
    )

    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert row.amount <= Decimal(3) + Decimal("1.00")
    everyone = AgentRun.objects.filter(configuration=config)
    assert_settled(row, everyone)
    assert_refusals(runs, "configuration")


# --- Varied prices and token counts, in different orders --------------------------------------

# (prompt, completion) tokens of one call, never above the bound of 12: 0.10 to 2.40 a call.
SIZES = [(1, 0), (2, 1), (0, 12), (3, 3), (5, 4), (12, 0), (4, 8), (6, 6), (1, 1), (9, 3)]
ORDERS = {
    "ascending": lambda sizes: sorted(sizes, key=lambda s: s[0] + 2 * s[1]),
    "descending": lambda sizes: sorted(sizes, key=lambda s: -(s[0] + 2 * s[1])),
    "shuffled": lambda sizes: random.Random(23).sample(sizes, len(sizes)),
}


def scripts(racers: int, order: str) -> list[list[dict[str, Any]]]:
    """Each racer's script: two tool turns and an answer, the calls' sizes dealt in ``order``
    (the first calls of the race are the small ones, or the large ones, or mixed)."""
    sizes = ORDERS[order](SIZES * 6)
    turn = {"tool_calls": [{"name": "list_notes"}]}
    dealt = []
    for index in range(racers):
        mine = [sizes[(index + racers * k) % len(sizes)] for k in range(3)]
        delays = [0.05 + 0.05 * ((index + k) % 4) for k in range(3)]
        dealt.append(
            [
                {**turn, "usage": usage(*mine[0]), "delay": delays[0]},
                {**turn, "usage": usage(*mine[1]), "delay": delays[1]},
                {"content": "done", "usage": usage(*mine[2]), "delay": delays[2]},
            ]
        )
    return dealt


# The conftest's ``postgres`` mark holds per test function (not per parameter): the races that
# SQLite's serialised writes can take too are their own tests.
@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_six_runs_with_varied_costs_overspend_by_at_most_one_call(order):
    varied_costs_race(6, order)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("racers", "order"), [(6, "shuffled"), (20, "shuffled"), (20, "descending")]
)
def test_racing_runs_with_varied_costs_overspend_by_at_most_one_call(racers, order):
    varied_costs_race(racers, order)


def varied_costs_race(racers: int, order: str) -> None:
    budget = Decimal("3.50")
    config = priced(daily_budget=budget, max_tokens_per_call=12)
    run_start_sync(
        configuration=config,
        prompt="warm",
        options={"script": [{"content": "a", "usage": usage(1, 0)}]},
    )

    runs = started(
        race(
            [
                lambda script=script: run_start_sync(
                    configuration=config, prompt="go", options={"script": script}
                )
                for script in scripts(racers, order)
            ]
        )
    )

    row = ledger(SpendScope.CONFIGURATION, config.pk)
    everyone = AgentRun.objects.filter(configuration=config)
    largest = max(cost(e) for e in answers(everyone))
    assert row.amount <= budget + largest
    assert row.amount >= budget  # the refused runs were refused by spend, not by a wait cut short
    assert_settled(row, everyone)
    assert_refusals(runs, "configuration")


@pytest.mark.postgres
@pytest.mark.parametrize("racers", [6, 20])
@override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "3.5"})
def test_one_users_runs_racing_across_configurations_overspend_by_at_most_one_call(racers):
    user = UserFactory()
    configurations = [
        priced(max_tokens_per_call=12),
        priced(
            price_per_million_prompt_tokens=Decimal("50000"),
            price_per_million_completion_tokens=Decimal("250000"),
            max_tokens_per_call=12,
        ),
        priced(price_per_million_completion_tokens=None, max_tokens_per_call=20),
    ]
    dealt = scripts(racers, "shuffled")

    runs = started(
        race(
            [
                lambda index=index: run_start_sync(
                    configuration=configurations[index % 3],
                    prompt="go",
                    initiator=user,
                    options={"script": dealt[index]},
                )
                for index in range(racers)
            ]
        )
    )

    row = ledger(SpendScope.USER, user.pk)
    largest = max(cost(e) for e in answers(runs))
    assert row.amount <= Decimal("3.5") + largest
    assert_settled(row, runs)
    assert_refusals(runs, "user")
    # Each configuration's own row (no budget of its own) was charged its answers, holding none.
    for configuration in configurations:
        mine = [r for r in runs if r.configuration_id == configuration.pk]
        if answers(mine):
            assert ledger(SpendScope.CONFIGURATION, configuration.pk).amount == sum(
                (r.cost for r in mine), Decimal(0)
            )


# --- The check itself, raced -----------------------------------------------------------------


@override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "6"})
def test_six_callers_racing_the_check_with_both_budgets_charges_and_failures():
    callers_race(6)


@pytest.mark.postgres
@override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "6"})
def test_twenty_callers_racing_the_check_with_both_budgets_charges_and_failures():
    callers_race(20)


def callers_race(racers: int) -> None:
    """Each caller checks, then charges a cost up to its bound or (every third call) fails and
    releases, until a budget refuses it. Three configurations of different prices and bounds
    share one user's budget; each has its own budget too."""
    user = UserFactory()
    configurations = [
        priced(daily_budget=Decimal("2.5"), max_tokens_per_call=12),
        priced(
            daily_budget=Decimal("3"),
            price_per_million_prompt_tokens=Decimal("300000"),
            max_tokens_per_call=5,
        ),
        priced(
            daily_budget=Decimal("1.75"),
            price_per_million_prompt_tokens=None,
            max_tokens_per_call=9,
        ),
    ]
    charged: dict[int, list[tuple[int, Decimal]]] = {}
    lock = threading.Lock()

    def caller(index: int) -> list[budgets.Exhausted]:
        configuration = configurations[index % 3]
        bound = budgets.call_bound(configuration)
        assert bound is not None
        mine = budgets.Holder(run_id=index, segment=f"caller-{index}", bound=bound, seconds=20)
        applicable = budgets.budgets_for(configuration=configuration, initiator_id=user.pk)
        draw = random.Random(index)
        for attempt in range(1000):
            verdict = budgets.reserve(applicable, holder=mine)
            if isinstance(verdict, budgets.Exhausted):
                return [verdict]
            time.sleep(draw.uniform(0, 0.03))
            if attempt % 3 == 2:
                budgets.release(verdict)
                continue
            spent = (bound * Decimal(draw.randint(1, 10)) / 10).quantize(budgets.QUANTUM)
            with transaction.atomic():
                budgets.charge(
                    budgets.Charge(
                        configuration_id=configuration.pk,
                        initiator_id=user.pk,
                        cost=spent,
                        reservation=verdict,
                    )
                )
            with lock:
                charged.setdefault(index, []).append((configuration.pk, spent))
        raise AssertionError("never refused")

    outcomes = race([lambda index=index: caller(index) for index in range(racers)])

    assert not [o.error for o in outcomes if o.error is not None]
    calls = [item for mine in charged.values() for item in mine]
    user_row = ledger(SpendScope.USER, user.pk)
    assert user_row.amount == sum((c for _, c in calls), Decimal(0))
    assert user_row.amount <= Decimal(6) + max(c for _, c in calls)
    for configuration in configurations:
        mine = [c for key, c in calls if key == configuration.pk]
        if not mine:
            # The shared user budget can run out before this configuration's callers charge
            # anything (only their holds were taken, and released): it has no ledger row then.
            assert not SpendDay.objects.filter(
                scope=SpendScope.CONFIGURATION, key=configuration.pk, amount__gt=0
            ).exists()
            continue
        row = ledger(SpendScope.CONFIGURATION, configuration.pk)
        assert row.amount == sum(mine, Decimal(0)) and row.calls == len(mine)
        assert row.amount <= configuration.daily_budget + max(mine, default=Decimal(0))
        assert row.reserved == 0
    assert user_row.reserved == 0 and not SpendHold.objects.exists()
    # Every caller stopped on a budget whose spend reached its limit (none on a wait cut short).
    for outcome in outcomes:
        [refusal] = outcome.value
        assert refusal.spent, refusal


# --- Waiting for the calls in flight ----------------------------------------------------------


def holder(bound: str, *, seconds: int = 20) -> budgets.Holder:
    return budgets.Holder(run_id=1, segment="test", bound=Decimal(bound), seconds=seconds)


def in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # reported to the test
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def test_a_call_refused_only_by_holds_waits_and_goes_when_one_is_released():
    config = priced(daily_budget=Decimal("3"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    first = budgets.reserve([budget], holder=holder("2.0"))
    second = budgets.reserve([budget], holder=holder("2.0"))  # 2.0 < 3: admitted
    assert isinstance(first, budgets.Reservation) and isinstance(second, budgets.Reservation)
    assert ledger(SpendScope.CONFIGURATION, config.pk).reserved == Decimal("4.0")

    thread, result = in_thread(lambda: budgets.reserve([budget], holder=holder("2.0")))
    time.sleep(0.3)
    assert thread.is_alive()  # 0 spent + 4.0 held: it waits
    budgets.release(first)
    thread.join(20)

    assert isinstance(result.get("value"), budgets.Reservation), result
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert row.reserved == Decimal("4.0") and row.amount == 0
    assert SpendHold.objects.count() == 2


def test_a_waiting_call_is_refused_as_soon_as_the_spend_reaches_the_limit():
    config = priced(daily_budget=Decimal("3"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    held = [budgets.reserve([budget], holder=holder("2.0")) for _ in range(2)]

    thread, result = in_thread(lambda: budgets.reserve([budget], holder=holder("2.0")))
    time.sleep(0.3)
    for reservation in held:
        with transaction.atomic():
            budgets.charge(
                budgets.Charge(
                    configuration_id=config.pk,
                    initiator_id=None,
                    cost=Decimal("1.6"),
                    reservation=reservation,
                )
            )
    thread.join(20)

    refusal = result.get("value")
    assert isinstance(refusal, budgets.Exhausted) and refusal.spent, result
    assert refusal.spend == Decimal("3.2") and refusal.reserved == 0
    assert refusal.message().startswith("the configuration's daily budget is spent: 3.200000")


def test_a_wait_ends_at_the_holders_deadline_with_what_is_held():
    config = priced(daily_budget=Decimal("3"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    budgets.reserve([budget], holder=holder("3.5"))

    began = time.monotonic()
    refusal = budgets.reserve([budget], holder=holder("1.0", seconds=1))

    assert isinstance(refusal, budgets.Exhausted) and not refusal.spent
    assert time.monotonic() - began >= 0.5  # it asked again before giving up
    assert refusal.payload()["reserved"] == "3.500000" and refusal.payload()["spend"] == "0.000000"
    assert "3.500000 more held by calls in flight" in refusal.message()
    # A wait the caller no longer wants (its lease is lost) ends at once.
    began = time.monotonic()
    refusal = budgets.reserve([budget], holder=holder("1.0"), waiting=lambda: False)
    assert isinstance(refusal, budgets.Exhausted) and time.monotonic() - began < 0.5


@override_settings(AGENTRUNS={**settings.AGENTRUNS, "USER_DAILY_BUDGET": "1"})
def test_no_wait_when_another_budget_of_the_call_is_spent():
    user = UserFactory()
    config = priced(daily_budget=Decimal("3"))
    applicable = budgets.budgets_for(configuration=config, initiator_id=user.pk)
    first = budgets.reserve(applicable, holder=holder("0.5"))
    assert isinstance(first, budgets.Reservation)
    with transaction.atomic():  # the user's budget is spent, the configuration's is not
        budgets.charge(
            budgets.Charge(
                configuration_id=config.pk,
                initiator_id=user.pk,
                cost=Decimal("1.2"),
                reservation=first,
            )
        )
    budgets.reserve(  # holds the rest of the configuration's budget
        budgets.budgets_for(configuration=config, initiator_id=None), holder=holder("2.0")
    )

    began = time.monotonic()
    refusal = budgets.reserve(applicable, holder=holder("0.5"))

    assert isinstance(refusal, budgets.Exhausted) and time.monotonic() - began < 1
    assert refusal.budget.scope == SpendScope.USER and refusal.spent


def test_a_run_cancelled_while_its_check_waits_ends_cancelled_holding_nothing():
    """The wait keeps the lease alive (the ticker): a cancel fails its renewal, the wait ends at
    once, and the run ends cancelled — not refused, no hold of its own left behind."""
    from agentruns.services.runs import run_cancel

    config = priced(daily_budget=Decimal("1"), max_tokens_per_call=10, timeout_seconds=300)
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    budgets.reserve([budget], holder=holder("1.5"))  # a call in flight elsewhere

    def cancel_when_started() -> None:
        deadline = time.monotonic() + 60
        while not AgentRun.objects.filter(configuration=config).exists():
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        time.sleep(0.3)  # inside its check's wait
        run_cancel(run_uuid=AgentRun.objects.get(configuration=config).uuid)

    canceller, cancelled = in_thread(cancel_when_started)
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEASE_SECONDS": 0.9}):
        result = run_start_sync(configuration=config, prompt="go")
    canceller.join(60)

    assert "error" not in cancelled, cancelled
    run = AgentRun.objects.get(pk=result.run.pk)
    assert run.status == Status.CANCELLED
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.BUDGET).exists()
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.REQUEST).exists()
    assert SpendHold.objects.get().amount == Decimal("1.5")  # only the other call's
    assert ledger(SpendScope.CONFIGURATION, config.pk).reserved == Decimal("1.5")


# --- Holds that lapse, and the answers that come after all ------------------------------------


def lapse_now() -> int:
    SpendHold.objects.update(expires_at=Now() - timedelta(seconds=1))
    return budgets.lapse_holds()


def test_a_lapsed_hold_is_charged_and_a_late_answer_corrects_it():
    config = priced(daily_budget=Decimal("10"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    reservation = budgets.reserve([budget], holder=holder("2.0"))
    assert isinstance(reservation, budgets.Reservation)

    assert budgets.lapse_holds() == 0  # not expired: nothing lapses
    assert lapse_now() == 1
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert (row.amount, row.reserved, row.lapsed_holds) == (Decimal("2.0"), 0, 1)

    # The segment was alive after all (slow, or paused): its answer is charged at its cost.
    with transaction.atomic():
        budgets.charge(
            budgets.Charge(
                configuration_id=config.pk,
                initiator_id=None,
                cost=Decimal("0.7"),
                reservation=reservation,
            )
        )
    row.refresh_from_db()
    assert (row.amount, row.reserved, row.calls) == (Decimal("0.7"), 0, 1)


def test_a_lapsed_hold_whose_call_failed_is_given_back():
    config = priced(daily_budget=Decimal("10"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    reservation = budgets.reserve([budget], holder=holder("2.0"))
    lapse_now()
    budgets.release(reservation)
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert (row.amount, row.reserved, row.calls) == (0, 0, 0)
    assert budgets.lapse_holds() == 0 and not SpendHold.objects.exists()


@pytest.mark.postgres
def test_lapses_racing_the_answers_settle_each_hold_once():
    config = priced(daily_budget=Decimal("1000"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    reservations = [budgets.reserve([budget], holder=holder("2.0")) for _ in range(40)]
    SpendHold.objects.update(expires_at=Now() - timedelta(seconds=1))

    def answer(reservation: budgets.Reservation) -> None:
        with transaction.atomic():
            budgets.charge(
                budgets.Charge(
                    configuration_id=config.pk,
                    initiator_id=None,
                    cost=Decimal("0.5"),
                    reservation=reservation,
                )
            )

    def lapse() -> int:
        return budgets.lapse_holds(batch=7)

    calls = [lambda r=r: answer(r) for r in reservations[:20]]
    outcomes = race([*calls, lapse, lapse, *[lambda r=r: answer(r) for r in reservations[20:]]])

    assert not [o.error for o in outcomes if o.error is not None]
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    # Lapsed or not, each answer ends charged at its cost, once; nothing is held.
    assert (row.amount, row.reserved, row.calls) == (Decimal("20.0"), 0, 40)
    assert row.lapsed_holds == outcomes[20].value + outcomes[21].value
    assert not SpendHold.objects.exists()


# --- Crash points in a segment -----------------------------------------------------------------


def expire_lease(run: AgentRun) -> None:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))


def test_a_segment_that_dies_after_its_check_leaves_a_hold_that_lapses_charged(monkeypatch):
    # The process dies as the model call starts (after the check and the request boundary).
    config = priced(
        daily_budget=Decimal("10"),
        max_tokens_per_call=10,
        script=[{"content": "done", "usage": usage(3, 2)}],
    )

    def dies(self: ScriptedProvider, **kwargs: Any) -> Any:
        raise ProcessDied()

    with monkeypatch.context() as patch:
        patch.setattr(ScriptedProvider, "complete", dies)
        with pytest.raises(ProcessDied):
            run_start_sync(configuration=config, prompt="go")
    run = AgentRun.objects.get(configuration=config)
    [hold] = SpendHold.objects.all()
    assert hold.run_id == run.pk and hold.segment == run.claimed_by
    assert hold.amount == Decimal("2.0")  # 10 tokens at 0.20
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert (row.amount, row.reserved) == (0, Decimal("2.0"))

    # The reaper hands the run back and lapses the hold: charged at what it held.
    expire_lease(run)
    SpendHold.objects.update(expires_at=Now() - timedelta(seconds=1))
    report = reaper.reap_stale_runs()
    assert report.count(Verdict.REQUEUED) == 1 and report.holds_lapsed == 1
    assert "1 budget hold(s) lapsed" in report.summary()
    row.refresh_from_db()
    assert (row.amount, row.reserved, row.lapsed_holds) == (Decimal("2.0"), 0, 1)

    # A worker continues it: the call is made again and charged at its cost.
    result = run_process_queued(run_uuid=run.uuid)
    assert result is not None and result.run.status == Status.COMPLETED
    row.refresh_from_db()
    assert row.amount == Decimal("2.0") + Decimal("0.7") and row.reserved == 0
    assert not SpendHold.objects.exists()


def test_a_segment_that_dies_inside_the_answers_write_leaves_neither_answer_nor_charge(
    monkeypatch, scripted_recordings
):
    """The worst gap: the model answered (the money is spent) and the process dies inside the
    write that records the answer, after its charge statements. They are one transaction: the
    answer, its cost and the hold's settling all roll back; the hold stays, then lapses charged
    at its bound (spend overstated, never understated); the next segment asks again."""
    config = priced(
        daily_budget=Decimal("10"),
        max_tokens_per_call=10,
        script=[{"content": "done", "usage": usage(3, 2)}],
    )
    real_charge = budgets.charge

    def charges_then_dies(entry: budgets.Charge) -> None:
        real_charge(entry)
        raise ProcessDied()

    with monkeypatch.context() as patch:
        patch.setattr(budgets, "charge", charges_then_dies)
        with pytest.raises(ProcessDied):
            run_start_sync(configuration=config, prompt="go")
    run = AgentRun.objects.get(configuration=config)
    assert len(ScriptedProvider.recordings[str(run.uuid)]) == 1  # the model was asked
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).exists()
    assert run.status == Status.RUNNING and run.cost == 0
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert (row.amount, row.reserved, row.calls) == (0, Decimal("2.0"), 0)
    assert SpendHold.objects.count() == 1

    expire_lease(run)
    SpendHold.objects.update(expires_at=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs().holds_lapsed == 1
    result = run_process_queued(run_uuid=run.uuid)
    assert result is not None and result.run.status == Status.COMPLETED

    assert len(ScriptedProvider.recordings[str(run.uuid)]) == 2
    row.refresh_from_db()
    # Two calls of 0.70 were made; the ledger has the recorded one and the lost one's bound.
    assert row.amount == Decimal("0.7") + Decimal("2.0") >= 2 * Decimal("0.7")
    assert (row.reserved, row.calls, row.lapsed_holds) == (0, 1, 1)
    assert AgentRun.objects.get(pk=run.pk).cost == Decimal("0.7")


def test_a_segment_that_dies_while_its_check_waits_has_recorded_its_last_step(probes, monkeypatch):
    """The last tool call of a turn is recorded with the next request; a check that waits
    writes it first. The process dies inside the wait: the call's event is kept, and the run,
    continued, does not run the call again."""
    config = priced(
        daily_budget=Decimal("1"),
        max_tokens_per_call=10,
        tools=["probe_read"],
        script=[
            {
                "tool_calls": [{"name": "probe_read", "arguments": {"value": "x"}}],
                "usage": usage(1, 0),
            },
            {"content": "done", "usage": usage(1, 0)},
        ],
    )
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    # While the tool runs, another call takes a hold on the rest of the budget.
    other: list[budgets.Reservation | budgets.Exhausted] = []
    probes.during = lambda entry: other.append(budgets.reserve([budget], holder=holder("1.5")))
    real_reserve_once, checks = budgets._reserve_once, []

    def dies_in_the_wait(*args: Any) -> Any:
        checks.append(args)
        if len(checks) == 4:  # the run's, the other's, the run's refused; now its wait
            raise ProcessDied()
        return real_reserve_once(*args)

    with monkeypatch.context() as patch:
        patch.setattr(budgets, "_reserve_once", dies_in_the_wait)
        with pytest.raises(ProcessDied):
            run_start_sync(configuration=config, prompt="go")
    run = AgentRun.objects.get(configuration=config)
    assert len(probes.seen) == 1
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL).count() == 1
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).count() == 1

    [held] = other
    assert isinstance(held, budgets.Reservation)
    budgets.release(held)  # the other call failed: the budget has room again
    expire_lease(run)
    assert reaper.reap_stale_runs().count(Verdict.REQUEUED) == 1
    result = run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.run.status == Status.COMPLETED
    assert len(probes.seen) == 1  # not run again
    assert ledger(SpendScope.CONFIGURATION, config.pk).amount == Decimal("0.2")


# --- What a call holds ------------------------------------------------------------------------


def test_a_call_holds_its_token_bound_at_the_higher_price():
    config = AgentConfiguration(
        price_per_million_prompt_tokens=Decimal("2.5"),
        price_per_million_completion_tokens=Decimal("10"),
        max_tokens_per_call=128_000,
    )
    assert budgets.call_bound(config) == Decimal("1.28")
    # Any split of the bound's tokens costs at most that.
    for prompt in (0, 1, 64_000, 127_999, 128_000):
        priced_call = budgets.call_cost(config, usage(prompt, 128_000 - prompt))
        assert priced_call is not None and priced_call.cost <= budgets.call_bound(config)
    # Rounded up, never down: 1 token at 0.0000015 holds 0.000002.
    config.price_per_million_completion_tokens = Decimal("1.5")
    config.price_per_million_prompt_tokens = None
    config.max_tokens_per_call = 1
    assert budgets.call_bound(config) == Decimal("0.000002")
    config.max_tokens_per_call = None
    assert budgets.call_bound(config) is None  # an estimate then: the day's largest call
    assert budgets.call_bound(AgentConfiguration(max_tokens_per_call=5)) == 0  # unpriced


def test_a_call_over_its_bound_is_charged_in_full_and_counted_as_an_overrun():
    config = priced(
        daily_budget=Decimal("10"),
        max_tokens_per_call=5,
        script=[{"content": "done", "usage": usage(10, 10)}],
    )
    run = run_start_sync(configuration=config, prompt="go").run
    assert run.status == Status.COMPLETED and run.cost == Decimal("3.0")
    row = ledger(SpendScope.CONFIGURATION, config.pk)
    assert (row.amount, row.reserved, row.overruns) == (Decimal("3.0"), 0, 1)


def test_without_a_bound_a_call_holds_the_days_largest_call():
    config = priced(daily_budget=Decimal("10"), script=[{"content": "a", "usage": usage(2, 1)}])
    run_start_sync(configuration=config, prompt="first")  # nothing charged yet: holds 0
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    reservation = budgets.reserve([budget], holder=budgets.Holder(1, "test", None, 20))
    assert isinstance(reservation, budgets.Reservation)
    assert reservation.held == {("configuration", config.pk): Decimal("0.4")}
    assert SpendHold.objects.get().amount == Decimal("0.4")


@pytest.mark.parametrize("bound", [0, -3])
def test_a_bound_below_one_token_is_refused(bound):
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError

    config = AgentConfigurationFactory.build(slug="bound", max_tokens_per_call=bound)
    with pytest.raises(ValidationError) as refused:
        config.full_clean()
    assert "max_tokens_per_call" in refused.value.message_dict
    with pytest.raises(IntegrityError), transaction.atomic():
        config.save()


def test_the_refusal_says_what_calls_in_flight_hold(client):
    from django.urls import reverse

    user = UserFactory(permissions=["playground.use_playground"])
    config = priced(daily_budget=Decimal("1"), max_tokens_per_call=10)
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    budgets.reserve([budget], holder=holder("1.5"))  # a call in flight elsewhere
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEASE_SECONDS": 1}):
        config.timeout_seconds = 1
        config.save(update_fields=["timeout_seconds"])
        run = run_start_sync(configuration=config, prompt="go", initiator=user).run

    assert run.termination_reason == TerminationReason.BUDGET_EXHAUSTED
    payload = AgentRunEvent.objects.get(run=run, kind=EventKind.BUDGET).payload
    assert payload["spend"] == "0.000000" and payload["reserved"] == "1.500000"
    client.force_login(user)
    trace = client.get(reverse("playground:run", args=[run.uuid])).content.decode()
    assert "0.000000 of 1.000000 USD, 1.500000 more held by calls in flight" in trace


def test_the_admin_shows_holds_and_the_ledger_read_only(admin_client):
    config = priced(daily_budget=Decimal("5"))
    [budget] = budgets.budgets_for(configuration=config, initiator_id=None)
    budgets.reserve([budget], holder=holder("1.25"))
    hold = SpendHold.objects.get()
    listed = admin_client.get("/admin/agentruns/spendhold/").content.decode()
    assert "1.250000" in listed
    assert admin_client.get("/admin/agentruns/spendhold/add/").status_code == 403
    detail = admin_client.get(f"/admin/agentruns/spendhold/{hold.pk}/change/")
    assert detail.status_code == 200 and b'name="amount"' not in detail.content
    assert admin_client.post(f"/admin/agentruns/spendhold/{hold.pk}/delete/").status_code == 403
    ledger_page = admin_client.get("/admin/agentruns/spendday/").content.decode()
    assert "1.250000" in ledger_page  # reserved
