"""Approval deadlines (docs/design.md §5.11): a configuration's ``approval_timeout`` fixes a
deadline, by the database clock, when a run starts waiting for approval or input; the reaper's
pass settles the runs past it — ``deny`` (the model is told it expired, the run continues
through the queue) or ``fail`` (``failed`` / ``approval_expired``) — through one guarded
transition with its decision event, the ledger intact. A person's decision past the deadline
is refused; a run in doubt is never touched.

Real runs through the services and the scripted provider, on both databases (the threaded race
is in ``races/test_deadlines.py``).
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django_q.models import OrmQ

from agentruns.exceptions import AlreadyDecided, ApprovalExpired
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    Counter,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.services import reaper, runs
from agentruns.services.deadline_sweep import expire_overdue
from agentruns.services.decisions import run_decide
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.transcript import EXPIRED_MESSAGE
from agentruns.turns import read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.deadlines import (
    AT_ONCE,
    LONG,
    WRITE,
    waiting_for_approval,
    waiting_for_input,
)
from tests.agentruns.support.runtime import (
    call,
    config,
    decide_inline,
    decider,
    events,
    outcome_unknown_once,
    sent,
    snapshot,
    tool_messages,
    tool_turn,
)
from tests.agentruns.support.transitions import refuse_event_inserts

pytestmark = pytest.mark.django_db(transaction=True)


def pass_deadline(run: AgentRun) -> None:
    """Time passes: the run's deadline is now a second behind the database clock."""
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))


def reap(*args: str) -> str:
    out = StringIO()
    call_command("reap_stale_runs", *args, stdout=out)
    return out.getvalue()


def verify_ledger(run: AgentRun) -> str:
    out = StringIO()
    call_command("verify_ledger", "--run", str(run.uuid), stdout=out)  # raises when broken
    return out.getvalue()


def deadline_events(run: AgentRun) -> list[AgentRunEvent]:
    return [e for e in events(run) if e.payload.get("by") == "deadline"]


# --- the configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [timedelta(0), timedelta(seconds=-5)])
def test_a_deadline_must_be_a_positive_duration(timeout):
    configuration = AgentConfigurationFactory.build(approval_timeout=timeout)
    with pytest.raises(ValidationError) as caught:
        configuration.full_clean()
    assert "approval_timeout" in caught.value.message_dict


def test_an_unknown_action_is_refused_and_a_positive_deadline_accepted():
    configuration = AgentConfigurationFactory.build(on_approval_timeout="approve")
    with pytest.raises(ValidationError) as caught:
        configuration.full_clean()
    assert "on_approval_timeout" in caught.value.message_dict
    fine = AgentConfigurationFactory.build(approval_timeout=timedelta(minutes=5))
    fine.full_clean()
    assert fine.on_approval_timeout == "deny"  # the default


# --- fixing the deadline -------------------------------------------------------------------------


@pytest.mark.parametrize("waiting", [waiting_for_approval, waiting_for_input])
def test_a_run_that_starts_waiting_gets_its_deadline_by_the_database_clock(probes, waiting):
    run = waiting(timeout=LONG, action="fail")
    # Written in the statement that also stamped updated_at: exactly the timeout apart.
    assert run.approval_deadline - run.updated_at == LONG
    assert run.approval_timeout_action == "fail"


def test_without_a_timeout_there_is_no_deadline_and_the_reaper_leaves_the_run(probes):
    run = waiting_for_approval(timeout=None)
    assert run.approval_deadline is None
    before = snapshot(run)
    report = reaper.reap_stale_runs()
    assert report.expired == []
    assert snapshot(run) == before


def test_the_deadline_is_fixed_when_the_run_starts_waiting(probes):
    run = waiting_for_approval(timeout=LONG, action="deny")
    fixed = run.approval_deadline
    configuration = run.configuration
    configuration.approval_timeout = timedelta(seconds=1)
    configuration.on_approval_timeout = "fail"
    configuration.save()
    run.refresh_from_db()
    assert (run.approval_deadline, run.approval_timeout_action) == (fixed, "deny")
    assert reaper.reap_stale_runs().expired == []  # 30 minutes, not 1 second


def test_each_wait_writes_its_own_deadline_from_the_version_the_run_pinned(probes):
    script = [tool_turn(WRITE), tool_turn(call("probe_create", value="y")), {"content": "ok"}]
    configuration = config(script=script, approval_timeout=LONG)
    first = runs.run_start_sync(configuration=configuration, prompt="two writes").run
    first = AgentRun.objects.get(pk=first.pk)
    assert first.approval_deadline is not None
    configuration.approval_timeout = None
    configuration.save()
    assert decide_inline(first).outcome == Outcome.AWAITING_APPROVAL
    second = AgentRun.objects.get(pk=first.pk)
    assert second.status == Status.WAITING_FOR_APPROVAL
    # Its second wait has a deadline of its own, from the version it started with.
    assert second.approval_deadline is not None and second.approval_deadline >= (
        first.approval_deadline
    )
    later = runs.run_start_sync(configuration=configuration, prompt="after the edit").run
    later = AgentRun.objects.get(pk=later.pk)
    assert later.status == Status.WAITING_FOR_APPROVAL
    assert later.approval_deadline is None and later.approval_timeout_action == ""


# --- deny --------------------------------------------------------------------------------------


def test_deny_at_the_deadline_tells_the_model_it_expired_and_continues_through_the_queue(
    probes, scripted_recordings
):
    run = waiting_for_approval(timeout=AT_ONCE, action="deny")
    digest = run.pending_turn["turn_digest"]
    queued_before = OrmQ.objects.count()

    output = reap()

    assert f"{run.uuid} segment=- rule=deadline verdict=denied -> queued" in output
    assert "past their approval deadline 1: denied 1, failed 0, skipped 0" in output
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.pending_turn is None
    [event] = deadline_events(run)
    assert event.kind == EventKind.APPROVAL and event.actor_id is None
    assert event.payload["approved"] is False and event.payload["action"] == "deny"
    assert event.payload["turn_digest"] == digest
    assert OrmQ.objects.count() == queued_before + 1  # woken through the queue
    assert run.loop_state["decision"] == {
        "kind": "approval",
        "approved": False,
        "decider_id": None,
        "turn_digest": digest,
        "by": "deadline",
    }

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result.outcome == Outcome.COMPLETED
    assert probes.seen == []  # the write never ran
    [tool] = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert tool.payload["outcome"] == "expired" and tool.payload["error"] == EXPIRED_MESSAGE
    # The model's next request carries the tool message saying so.
    [message] = tool_messages(sent(run)[-1]).values()
    assert EXPIRED_MESSAGE in message
    mode, summary = verify_ledger(run).splitlines()
    assert mode.startswith("mode: ") and summary.startswith("1 runs,") and "intact" in summary


def test_an_input_request_past_its_deadline_is_answered_as_expired(probes):
    run = waiting_for_input(timeout=AT_ONCE, action="deny")

    [verdict] = reaper.reap_stale_runs().expired

    assert (verdict.rule, verdict.verdict, verdict.result) == ("deadline", "denied", "queued")
    [event] = deadline_events(run)
    assert event.kind == EventKind.INPUT and event.payload["name"] == "probe_ask"
    assert event.payload["expired"] is True and event.payload["values"] is None
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == Outcome.COMPLETED
    assert probes.seen == []  # the tool that asked never ran
    [tool] = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert (tool.payload["name"], tool.payload["outcome"]) == ("probe_ask", "expired")
    verify_ledger(run)


def test_deny_on_a_configuration_deactivated_meanwhile_fails_the_run_instead(probes):
    run = waiting_for_approval(timeout=AT_ONCE, action="deny")
    run.configuration.is_active = False
    run.configuration.save()
    [verdict] = reaper.reap_stale_runs().expired
    assert verdict.verdict == "dead_lettered"
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.FAILED, "approval_expired")


# --- fail --------------------------------------------------------------------------------------


@pytest.mark.parametrize("waiting", [waiting_for_approval, waiting_for_input])
def test_fail_at_the_deadline_ends_the_run_failed_approval_expired(probes, waiting):
    run = waiting(timeout=AT_ONCE, action="fail")
    queued_before = OrmQ.objects.count()

    output = reap()

    assert "rule=deadline verdict=dead_lettered -> failed/approval_expired" in output
    run.refresh_from_db()
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.APPROVAL_EXPIRED
    assert run.finished_at is not None and run.pending_turn is None
    assert run.error["type"] == "ApprovalExpired"
    assert (run.claimed_by, run.lease_expires) == ("", None)
    [event] = deadline_events(run)
    assert event.payload["action"] == "fail"
    assert OrmQ.objects.count() == queued_before  # nothing to wake
    verify_ledger(run)
    # Terminal is terminal: another pass finds nothing.
    assert reaper.reap_stale_runs().expired == []


# --- who wins ------------------------------------------------------------------------------------


def test_a_decision_past_the_deadline_is_refused_and_changes_nothing(probes):
    run = waiting_for_approval(timeout=LONG)
    pass_deadline(run)
    before = snapshot(run)
    with pytest.raises(ApprovalExpired):
        decide_inline(run)
    with pytest.raises(ApprovalExpired):
        decide_inline(run, approved=False)
    assert snapshot(run) == before
    assert probes.seen == []
    # The deadline settles it, once; the person's decision then reads "already decided".
    [verdict] = reaper.reap_stale_runs().expired
    assert verdict.verdict == "denied"
    with pytest.raises(AlreadyDecided):
        decide_inline(run)
    assert len(deadline_events(run)) == 1


def test_input_past_the_deadline_is_refused(probes):
    run = waiting_for_input(timeout=LONG)
    pass_deadline(run)
    before = snapshot(run)
    with pytest.raises(ApprovalExpired):
        runs.run_submit_input(
            run_uuid=run.uuid,
            actor=decider(),
            values={"answer": "blue"},
            turn_digest=read_pending_turn(run).turn_digest,
            mode="queued",
        )
    assert snapshot(run) == before


def test_a_decision_before_the_deadline_wins_and_the_deadline_then_finds_nothing(probes):
    run = waiting_for_approval(timeout=LONG)
    assert decide_inline(run).outcome == Outcome.COMPLETED
    pass_deadline(run)  # even were a deadline written now: the run no longer waits
    assert reaper.reap_stale_runs().expired == []
    assert deadline_events(run) == []


def test_a_run_in_doubt_is_never_settled_by_a_deadline(probes):
    run = waiting_for_approval(timeout=LONG)
    probes.during = outcome_unknown_once()
    assert decide_inline(run).outcome == Outcome.AWAITING_RECONCILIATION
    pass_deadline(run)
    before = snapshot(run)
    assert reaper.reap_stale_runs().expired == []
    assert snapshot(run) == before
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_RECONCILIATION


def test_a_cancelled_run_is_not_settled_by_its_deadline(probes):
    run = waiting_for_approval(timeout=AT_ONCE)
    assert runs.run_cancel(run_uuid=run.uuid, actor=None)
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    assert reaper.reap_stale_runs().expired == []
    assert deadline_events(run) == []


# --- the deadline ends with the wait --------------------------------------------------------------


def deadline_columns(run: AgentRun) -> tuple[Any, str]:
    fresh = AgentRun.objects.get(pk=run.pk)
    return fresh.approval_deadline, fresh.approval_timeout_action


def decision_writes(queries: CaptureQueriesContext) -> list[str]:
    """The statements that wrote the run's row (the decision's guarded ``UPDATE``, with its
    events on PostgreSQL)."""
    table = AgentRun._meta.db_table
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("UPDATE", "WITH")) and table in q["sql"]
    ]


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
def test_a_decision_clears_the_deadline_in_its_own_update(probes, approved):
    run = waiting_for_approval(timeout=LONG, action="fail")
    assert deadline_columns(run)[0] is not None
    with CaptureQueriesContext(connection) as queries:
        result = run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            approved=approved,
            turn_digest=run.pending_turn["turn_digest"],
            mode="queued",
        )
    assert result.outcome == Outcome.QUEUED
    assert deadline_columns(run) == (None, "")
    [write] = decision_writes(queries)  # no statement of its own
    assert "approval_deadline" in write and "approval_timeout_action" in write
    # The worker's segment finds no deadline left over from the wait.
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == Outcome.COMPLETED
    assert deadline_columns(run) == (None, "")


def test_an_inline_approval_leaves_no_deadline_behind(probes):
    run = waiting_for_approval(timeout=LONG)
    assert decide_inline(run).outcome == Outcome.COMPLETED
    assert deadline_columns(run) == (None, "")


def test_an_answer_clears_the_input_deadline(probes):
    run = waiting_for_input(timeout=LONG)
    result = runs.run_submit_input(
        run_uuid=run.uuid,
        actor=decider(),
        values={"answer": "blue"},
        turn_digest=read_pending_turn(run).turn_digest,
        mode="queued",
    )
    assert result.outcome == Outcome.QUEUED
    assert deadline_columns(run) == (None, "")


@pytest.mark.parametrize("waiting", [waiting_for_approval, waiting_for_input])
def test_a_cancel_clears_the_deadline(probes, waiting):
    run = waiting(timeout=LONG)
    assert runs.run_cancel(run_uuid=run.uuid, actor=None)
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert deadline_columns(run) == (None, "")


@pytest.mark.parametrize("action", ["deny", "fail"])
def test_the_deadline_verdict_spends_the_deadline(probes, action):
    run = waiting_for_approval(timeout=AT_ONCE, action=action)
    passed = AgentRun.objects.get(pk=run.pk).approval_deadline
    [outcome] = expire_overdue(identity="reaper:test")
    assert outcome.taken and outcome.deadline == passed  # the deadline that passed, as read
    [event] = deadline_events(run)
    assert event.payload["deadline"] == passed.isoformat()
    assert deadline_columns(run) == (None, "")


# --- the pass: dry run, metrics, failures --------------------------------------------------------


def test_a_dry_run_says_what_would_happen_and_changes_nothing(probes):
    run = waiting_for_approval(timeout=AT_ONCE, action="fail")
    before = snapshot(run)
    output = reap("--dry-run")
    assert f"{run.uuid} segment=- rule=deadline verdict=dead_lettered" in output
    assert "(dry run: nothing changed)" in output
    assert snapshot(run) == before


def test_the_pass_counts_deadline_verdicts_for_metrics(probes):
    waiting_for_approval(timeout=AT_ONCE, action="deny")
    waiting_for_approval(timeout=AT_ONCE, action="fail")
    reaper.reap_stale_runs()
    counted = {c.labels: c.value for c in Counter.objects.filter(name="reaper_verdicts")}
    assert counted["rule=deadline,verdict=denied"] == 1
    assert counted["rule=deadline,verdict=dead_lettered"] == 1


def test_a_settle_whose_event_cannot_be_written_changes_nothing_and_the_next_pass_settles(
    probes, monkeypatch
):
    """The crash point inside the settle: its event cannot be written (on SQLite after its
    UPDATE took the row; on PostgreSQL the two are one statement). Nothing of it stays — the
    run still waits, no digest spent — and the pass reports it skipped; the next pass settles
    it with its one event."""
    run = waiting_for_approval(timeout=AT_ONCE, action="deny")
    before = snapshot(run)

    with monkeypatch.context() as patch:
        refuse_event_inserts(patch)
        [verdict] = reaper.reap_stale_runs().expired

    assert verdict.verdict == "skipped" and "state write failed" in verdict.detail
    assert snapshot(run) == before
    [verdict] = reaper.reap_stale_runs().expired
    assert verdict.verdict == "denied"
    assert len(deadline_events(run)) == 1
    verify_ledger(run)


def test_the_deadline_is_written_by_the_suspends_own_update(probes):
    """No moment exists in which the run waits without its deadline: the suspend's one guarded
    ``UPDATE`` parks the run and fixes the deadline (there is no second statement to crash
    between)."""
    configuration = config(script=[tool_turn(WRITE), {"content": "done"}], approval_timeout=LONG)
    table = AgentRun._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        result = runs.run_start_sync(configuration=configuration, prompt="write x")

    assert result.run.status == Status.WAITING_FOR_APPROVAL
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if "approval_deadline" in q["sql"]
        and (q["sql"].lstrip().upper().startswith(("UPDATE", "WITH")))
        and table in q["sql"]
    ]
    assert len(writes) == 1, writes
    assert "pending_turn" in writes[0] and "status" in writes[0]
    run = AgentRun.objects.get(pk=result.run.pk)
    assert run.approval_deadline is not None and run.approval_timeout_action == "deny"
    verify_ledger(run)


# --- what people and clients see ------------------------------------------------------------------


def test_the_api_shows_the_deadline_and_refuses_a_decision_past_it(probes):
    from tests.agentruns.factories import UserFactory
    from tests.agentruns.support.api import DECIDE, client_for

    api = client_for(UserFactory(username="api-decider", permissions=[DECIDE]))
    run = waiting_for_approval(timeout=LONG, action="fail")
    body = api.get(f"/api/runs/{run.uuid}/").json()
    assert body["pending_turn"]["on_deadline"] == "fail"
    shown = body["pending_turn"]["deadline"]
    assert shown.replace("Z", "+00:00") == run.approval_deadline.isoformat()

    pass_deadline(run)
    answer = api.post(
        f"/api/runs/{run.uuid}/decision/",
        {"approved": True, "turn_digest": run.pending_turn["turn_digest"]},
        format="json",
    )
    assert answer.status_code == 409 and answer.json()["code"] == "approval_expired"

    untimed = waiting_for_approval(timeout=None)
    pending = api.get(f"/api/runs/{untimed.uuid}/").json()["pending_turn"]
    assert (pending["deadline"], pending["on_deadline"]) == (None, None)


def test_the_admin_form_offers_the_deadline_and_refuses_a_non_positive_one(client):
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    configuration = AgentConfigurationFactory(slug="timed", name="Timed")
    url = reverse("admin:agentruns_agentconfiguration_change", args=[configuration.pk])
    form = client.get(url).content.decode()
    assert 'name="approval_timeout"' in form and 'name="on_approval_timeout"' in form
    fields = {
        "slug": "timed",
        "name": "Timed",
        "provider": "scripted",
        "timeout_seconds": 30,
        "tools": "[]",
        "max_iterations": 10,
        "script": "[]",
        "is_active": "on",
        "on_approval_timeout": "fail",
    }
    refused = client.post(url, {**fields, "approval_timeout": "00:00:00"})
    assert refused.status_code == 200
    assert "A deadline must be a positive duration" in refused.content.decode()
    configuration.refresh_from_db()
    assert configuration.approval_timeout is None
    saved = client.post(url, {**fields, "approval_timeout": "00:30:00"})
    assert saved.status_code == 302
    configuration.refresh_from_db()
    assert configuration.approval_timeout == timedelta(minutes=30)
    assert configuration.on_approval_timeout == "fail"
