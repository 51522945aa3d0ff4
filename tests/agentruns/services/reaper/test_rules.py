"""The reaper's rules (docs/design.md §8.2) on whichever database the suite runs on (SQLite and
PostgreSQL).

Races between reapers and crashes of real processes are in ``crashes/test_workers.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import F
from django.test import override_settings
from django.utils import timezone
from django_q.models import OrmQ

from agentruns import transitions
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import dispatch, reaper
from agentruns.services.reaper import Rule, Verdict
from tests.agentruns.factories import HOLDER, AgentRunFactory
from tests.agentruns.support.transitions import claim_lease

pytestmark = pytest.mark.django_db


def queued_task_uuids() -> list[str]:
    """The run uuids carried by the django-q2 tasks waiting in the ORM broker."""
    return [task.task["args"][0] for task in OrmQ.objects.all()]


def reaper_events(run: AgentRun) -> list[AgentRunEvent]:
    return list(run.events.filter(kind=EventKind.REAPER).order_by("sequence"))


def only_verdict(report: reaper.ReaperReport, run: AgentRun) -> reaper.RunVerdict:
    found = [v for v in report.verdicts if v.run_uuid == run.uuid]
    assert len(found) == 1, report.verdicts
    return found[0]


# --- Rule 1: the fence -------------------------------------------------------------------------


def test_fenced_non_idempotent_write_goes_to_reconciliation_and_keeps_the_fence():
    run = AgentRunFactory(stale=True, fenced=True, requeue_count=0)

    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert run.pending_call["name"] == "create_note"
    assert run.claimed_by == "" and run.lease_expires is None
    assert run.requeue_count == 0
    assert run.pending_turn["kind"] == "reconciliation"
    assert run.pending_turn["call"]["id"] == "call_0_0"
    assert run.pending_turn["segment"] == HOLDER
    assert run.pending_turn["idempotency_key"] == f"{run.uuid}:call_0_0"
    assert len(run.pending_turn["turn_digest"]) == 64
    verdict = only_verdict(report, run)
    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.FENCE,
        Verdict.IN_DOUBT,
        HOLDER,
    )
    [event] = reaper_events(run)
    assert event.payload["rule"] == Rule.FENCE
    assert event.payload["verdict"] == Verdict.IN_DOUBT
    assert event.payload["abandoned_by"] == HOLDER
    assert event.segment.startswith("reaper:")
    assert queued_task_uuids() == []  # never retried automatically


def test_the_fence_wins_over_a_spent_budget_and_an_unreadable_state():
    run = AgentRunFactory(
        stale=True, fenced=True, requeue_count=99, loop_state={"iteration": "corrupt"}
    )

    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert only_verdict(report, run).rule == Rule.FENCE


# --- Rule 2: not rehydratable ------------------------------------------------------------------


@pytest.mark.parametrize(
    "loop_state",
    [
        {"iteration": "three"},
        {"turn": {"calls": "not a list"}},
        {"turn": {"calls": [{"id": 7, "name": "list_notes"}]}},
        ["not", "an", "object"],
    ],
)
def test_a_run_whose_state_cannot_be_rehydrated_is_settled_not_resumable(loop_state):
    run = AgentRunFactory(stale=True, loop_state=loop_state)

    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.FAILED, "not_resumable")
    assert run.error["type"] == "NotRehydratable"
    assert run.claimed_by == "" and run.finished_at is not None
    verdict = only_verdict(report, run)
    assert (verdict.rule, verdict.verdict) == (Rule.NOT_REHYDRATABLE, Verdict.DEAD_LETTERED)
    assert [e.payload["rule"] for e in reaper_events(run)] == [Rule.NOT_REHYDRATABLE]
    assert queued_task_uuids() == []


def test_a_gap_in_the_event_stream_is_not_rehydratable():
    run = AgentRunFactory(stale=True)
    AgentRunEvent.objects.create(run=run, sequence=0, kind=EventKind.LEASE, payload={})
    AgentRunEvent.objects.create(run=run, sequence=2, kind=EventKind.LEASE, payload={})

    reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.termination_reason == "not_resumable"


# --- Rule 3: the budget ------------------------------------------------------------------------


def test_a_run_out_of_retries_is_settled_retries_exhausted():
    run = AgentRunFactory(stale=True, requeue_count=settings.AGENTRUNS["MAX_REQUEUES"])

    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.FAILED, "retries_exhausted")
    assert run.requeue_count == settings.AGENTRUNS["MAX_REQUEUES"]
    verdict = only_verdict(report, run)
    assert (verdict.rule, verdict.verdict) == (Rule.BUDGET, Verdict.DEAD_LETTERED)
    assert queued_task_uuids() == []


def test_the_budget_is_read_from_the_settings_at_call_time():
    run = AgentRunFactory(stale=True, requeue_count=1)

    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MAX_REQUEUES": 1}):
        reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.termination_reason == "retries_exhausted"


# --- Rule 4: reclaim ---------------------------------------------------------------------------


def test_a_stale_run_within_budget_is_requeued_with_a_wake_up():
    run = AgentRunFactory(
        stale=True,
        requeue_count=1,
        pending_effect=Effect.IDEMPOTENT_WRITE,
        pending_call={"id": "call_0_0", "name": "update_note", "arguments": {"id": 1}},
        loop_state={"iteration": 1, "turn": {"calls": [], "done": []}},
    )

    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.status == Status.QUEUED
    assert run.requeue_count == 2
    assert run.claimed_by == "" and run.lease_expires is None
    # An idempotent write in flight is simply re-executed: the fence is cleared.
    assert run.pending_effect == "" and run.pending_call is None
    assert run.lease_epoch == 1  # the next claim takes epoch 2 and fences the dead holder
    assert run.loop_state == {"iteration": 1, "turn": {"calls": [], "done": []}}
    verdict = only_verdict(report, run)
    assert (verdict.rule, verdict.verdict) == (Rule.RECLAIM, Verdict.REQUEUED)
    assert queued_task_uuids() == [str(run.uuid)]
    [event] = reaper_events(run)
    assert event.payload["abandoned_by"] == HOLDER
    assert event.payload["requeue_count"] == 1


def test_a_reclaimed_run_whose_wake_up_cannot_be_sent_is_settled_not_left_queued(monkeypatch):
    run = AgentRunFactory(stale=True)

    def broken(run_uuid, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(dispatch, "send_wakeup", broken)
    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.FAILED, "not_retryable")
    assert run.error["type"] == "DispatchFailed"
    assert "broker down" in run.error["message"]
    verdict = only_verdict(report, run)
    assert (verdict.rule, verdict.verdict) == (Rule.RECLAIM, Verdict.DEAD_LETTERED)
    assert [e.payload["verdict"] for e in reaper_events(run)] == [
        Verdict.REQUEUED,
        Verdict.DEAD_LETTERED,
    ]


def test_a_failed_send_does_not_settle_a_run_a_worker_already_claimed(monkeypatch):
    run = AgentRunFactory(stale=True)
    real_settle = transitions.run_settle_undispatched

    def broken(run_uuid, **kwargs):
        raise ConnectionError("broker down")

    def claimed_first(**kwargs):
        # A duplicate task reached a worker between the reclaim's commit and the settle.
        assert claim_lease(run_id=run.pk, identity="worker:other:2")
        return real_settle(**kwargs)

    monkeypatch.setattr(dispatch, "send_wakeup", broken)
    monkeypatch.setattr(transitions, "run_settle_undispatched", claimed_first)
    report = reaper.reap_stale_runs()

    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.claimed_by == "worker:other:2"
    assert only_verdict(report, run).verdict == Verdict.REQUEUED


def test_one_failed_send_does_not_undo_the_other_wake_ups_of_its_batch(monkeypatch):
    unlucky, lucky = AgentRunFactory(stale=True), AgentRunFactory(stale=True)
    real_send = dispatch.send_wakeup

    def flaky(run_uuid, **kwargs):
        real_send(run_uuid, **kwargs)  # the task row is written, then the send fails
        if run_uuid == str(unlucky.uuid):
            raise ConnectionError("broker hiccup")

    monkeypatch.setattr(dispatch, "send_wakeup", flaky)
    reaper.reap_stale_runs()

    unlucky.refresh_from_db()
    lucky.refresh_from_db()
    assert (unlucky.status, lucky.status) == (Status.FAILED, Status.QUEUED)
    assert queued_task_uuids() == [str(lucky.uuid)]


# --- What every rule shares --------------------------------------------------------------------


def test_live_waiting_queued_and_terminal_runs_are_left_alone():
    live = AgentRunFactory(running=True)
    untouched = [
        live,
        AgentRunFactory(waiting=True),
        AgentRunFactory(in_doubt=True),
        AgentRunFactory(status=Status.QUEUED),
        AgentRunFactory(completed=True, lease_expires=timezone.now() - timedelta(hours=1)),
        AgentRunFactory(cancelled=True, lease_expires=timezone.now() - timedelta(hours=1)),
    ]
    before = {r.pk: (r.status, r.lease_expires) for r in AgentRun.objects.all()}

    report = reaper.reap_stale_runs()

    assert report.found == 0
    assert {r.pk: (r.status, r.lease_expires) for r in AgentRun.objects.all()} == before
    assert not AgentRunEvent.objects.filter(run__in=untouched).exists()


def test_staleness_is_rechecked_inside_the_update(monkeypatch):
    """A holder that renews after the reaper selected its run keeps it (verdict skipped)."""
    plain = AgentRunFactory(stale=True)
    fenced = AgentRunFactory(stale=True, fenced=True)
    spent = AgentRunFactory(stale=True, requeue_count=50)
    real_rule_for = reaper.rule_for

    def renew_then_judge(run):
        AgentRun.objects.filter(pk=run.pk).update(
            lease_expires=timezone.now() + timedelta(seconds=60)
        )
        return real_rule_for(run)

    monkeypatch.setattr(reaper, "rule_for", renew_then_judge)
    report = reaper.reap_stale_runs()

    assert [v.verdict for v in report.verdicts] == [Verdict.SKIPPED] * 3
    for run in (plain, fenced, spent):
        run.refresh_from_db()
        assert run.status == Status.RUNNING and run.claimed_by == HOLDER
        assert reaper_events(run) == []
    assert queued_task_uuids() == []


def test_oldest_lease_first_and_the_limit():
    now = timezone.now()
    newest = AgentRunFactory(stale=True, lease_expires=now - timedelta(seconds=10))
    oldest = AgentRunFactory(stale=True, lease_expires=now - timedelta(seconds=300))
    middle = AgentRunFactory(stale=True, lease_expires=now - timedelta(seconds=100))

    report = reaper.reap_stale_runs(limit=2)

    assert [v.run_uuid for v in report.verdicts] == [oldest.uuid, middle.uuid]
    newest.refresh_from_db()
    assert newest.status == Status.RUNNING


def test_batches_cover_every_stale_run_once():
    now = timezone.now()
    runs = [
        AgentRunFactory(stale=True, lease_expires=now - timedelta(seconds=60))  # equal leases
        for _ in range(4)
    ] + [AgentRunFactory(stale=True, lease_expires=now - timedelta(seconds=n)) for n in (5, 9)]

    report = reaper.reap_stale_runs(batch_size=2)

    assert sorted(str(v.run_uuid) for v in report.verdicts) == sorted(str(r.uuid) for r in runs)
    assert AgentRun.objects.filter(status=Status.QUEUED).count() == 6


def test_dry_run_judges_and_changes_nothing():
    plain = AgentRunFactory(stale=True)
    fenced = AgentRunFactory(stale=True, fenced=True)
    spent = AgentRunFactory(stale=True, requeue_count=3)
    broken = AgentRunFactory(stale=True, loop_state={"iteration": None})
    before = list(AgentRun.objects.order_by("pk").values())

    report = reaper.reap_stale_runs(dry_run=True, batch_size=1)

    assert {v.run_uuid: (v.rule, v.verdict) for v in report.verdicts} == {
        plain.uuid: (Rule.RECLAIM, Verdict.REQUEUED),
        fenced.uuid: (Rule.FENCE, Verdict.IN_DOUBT),
        spent.uuid: (Rule.BUDGET, Verdict.DEAD_LETTERED),
        broken.uuid: (Rule.NOT_REHYDRATABLE, Verdict.DEAD_LETTERED),
    }
    assert list(AgentRun.objects.order_by("pk").values()) == before
    assert not AgentRunEvent.objects.exists()
    assert queued_task_uuids() == []
    assert "dry run" in report.summary()


def test_summary_counts_each_verdict():
    AgentRunFactory(stale=True)
    AgentRunFactory(stale=True)
    AgentRunFactory(stale=True, fenced=True)
    AgentRunFactory(stale=True, requeue_count=3)

    report = reaper.reap_stale_runs()

    assert report.summary() == (
        "found 4, requeued 2, in doubt 1, dead-lettered 1, skipped 0; "
        "redispatched 0 unclaimed queued run(s)"
    )


@pytest.mark.parametrize("bad", [0, -1])
def test_a_non_positive_limit_is_refused(bad):
    with pytest.raises(ValueError, match="positive"):
        reaper.reap_stale_runs(limit=bad)


# --- Redispatch --------------------------------------------------------------------------------


def test_queued_runs_nobody_claimed_get_one_fresh_wake_up_per_period():
    forgotten = AgentRunFactory(status=Status.QUEUED)
    recent = AgentRunFactory(status=Status.QUEUED)
    AgentRun.objects.filter(pk=forgotten.pk).update(
        updated_at=timezone.now() - timedelta(seconds=settings.AGENTRUNS["REDISPATCH_SECONDS"] + 5)
    )

    first = reaper.reap_stale_runs()
    second = reaper.reap_stale_runs()

    assert (first.redispatched, second.redispatched) == (1, 0)
    assert queued_task_uuids() == [str(forgotten.uuid)]
    [event] = reaper_events(forgotten)
    assert event.payload["verdict"] == "redispatched"
    assert reaper_events(recent) == []
    forgotten.refresh_from_db()
    assert forgotten.status == Status.QUEUED  # the claim decides, not the reaper


def test_redispatch_window_follows_the_setting():
    run = AgentRunFactory(status=Status.QUEUED)
    AgentRun.objects.filter(pk=run.pk).update(updated_at=F("updated_at") - timedelta(seconds=20))

    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "REDISPATCH_SECONDS": 10}):
        assert reaper.redispatch_unclaimed() == 1
    assert queued_task_uuids() == [str(run.uuid)]
