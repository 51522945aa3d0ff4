"""How runs end (docs/design.md §2.3): ``run_settle`` (own, stale-only, unguarded), ``run_cancel``
and ``run_notice_cancel``; terminal is terminal.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status, TerminationReason
from agentruns.transitions import (
    run_cancel,
    run_heartbeat,
    run_notice_cancel,
    run_settle,
    run_stamp_fence,
)
from tests.agentruns.factories import AgentRunFactory, UserFactory
from tests.agentruns.support.transitions import (
    CALL,
    ME,
    REAPER,
    events,
    expire,
    reaper_event,
    snapshot,
    start,
    wrong_epoch,
    wrong_owner,
)

pytestmark = pytest.mark.django_db


# --- settle --------------------------------------------------------------------------------------


def test_own_settle_writes_the_outcome_and_clears_everything():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.IDEMPOTENT_WRITE, call=CALL)

    assert run_settle(
        run_id=lease.run_id,
        lease=lease,
        status=Status.COMPLETED,
        reason=TerminationReason.COMPLETED,
        output="42",
        totals={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "iterations": 2},
        events=[EventSpec(EventKind.LLM, {"content": "42"})],
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.termination_reason, run.output) == (
        Status.COMPLETED,
        TerminationReason.COMPLETED,
        "42",
    )
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens, run.iterations) == (
        10,
        5,
        15,
        2,
    )
    assert (run.claimed_by, run.lease_expires, run.pending_effect, run.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert run.finished_at is not None
    assert events(run.pk)[-1] == (1, EventKind.LLM, ME, 1)
    assert lease.next_sequence == 2


def test_settle_refuses_a_status_that_is_not_terminal():
    lease = start()

    with pytest.raises(ValueError):
        run_settle(run_id=lease.run_id, lease=lease, status=Status.QUEUED, reason="completed")

    assert AgentRun.objects.get(pk=lease.run_id).status == Status.RUNNING


def test_stale_only_settle_needs_a_stale_lease():
    lease = start()
    before = snapshot(lease.run_id)

    assert (
        run_settle(
            run_id=lease.run_id,
            stale_only=True,
            status=Status.FAILED,
            reason=TerminationReason.RETRIES_EXHAUSTED,
            events=[reaper_event()],
            segment=REAPER,
        )
        is False
    )
    assert snapshot(lease.run_id) == before

    expire(lease.run_id)
    assert run_settle(
        run_id=lease.run_id,
        stale_only=True,
        status=Status.FAILED,
        reason=TerminationReason.RETRIES_EXHAUSTED,
        events=[reaper_event()],
        segment=REAPER,
    )
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.RETRIES_EXHAUSTED,
    )
    assert events(run.pk)[-1] == (1, EventKind.REAPER, REAPER, 0)
    assert run_heartbeat(lease) is False


@pytest.mark.parametrize("trait", ["waiting", "in_doubt", "completed"])
def test_stale_only_settle_ignores_runs_that_are_not_running(trait):
    run = AgentRunFactory(**{trait: True}, lease_expires=timezone.now() - timedelta(minutes=5))
    before = snapshot(run.pk)

    assert (
        run_settle(run_id=run.pk, stale_only=True, status=Status.FAILED, reason="not_resumable")
        is False
    )
    assert snapshot(run.pk) == before


@pytest.mark.parametrize("trait", ["queued", "running", "waiting", "waiting_for_input", "in_doubt"])
def test_unguarded_settle_ends_any_live_run(trait):
    run = AgentRunFactory(**({} if trait == "queued" else {trait: True}))

    assert run_settle(run_id=run.pk, status=Status.FAILED, reason="not_retryable")

    run = AgentRun.objects.get(pk=run.pk)
    assert (run.status, run.claimed_by, run.pending_turn, run.pending_effect) == (
        Status.FAILED,
        "",
        None,
        "",
    )


@pytest.mark.parametrize("trait", ["completed", "failed", "cancelled"])
@pytest.mark.parametrize("variant", ["plain", "stale_only"])
def test_terminal_is_terminal_for_settle(trait, variant):
    run = AgentRunFactory(
        **{trait: True}, claimed_by="x", lease_expires=timezone.now() - timedelta(minutes=5)
    )
    before = snapshot(run.pk)

    assert (
        run_settle(
            run_id=run.pk,
            status=Status.COMPLETED,
            reason=TerminationReason.COMPLETED,
            output="late",
            stale_only=variant == "stale_only",
            events=[EventSpec(EventKind.LLM)],
        )
        is False
    )

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_a_late_settle_or_cancel_after_a_settle_changes_nothing():
    lease = start()
    assert run_settle(
        run_id=lease.run_id,
        lease=lease,
        status=Status.COMPLETED,
        reason=TerminationReason.COMPLETED,
        output="first",
    )
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    assert run_settle(run_id=lease.run_id, lease=lease, status=Status.FAILED, reason="x") is False
    assert run_settle(run_id=lease.run_id, status=Status.FAILED, reason="tool_failed") is False
    assert run_cancel(run_id=lease.run_id) is False

    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events


# --- cancel --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trait", ["queued", "running", "stale", "waiting", "waiting_for_input", "in_doubt"]
)
def test_cancel_ends_any_live_run(trait):
    run = AgentRunFactory(**({} if trait == "queued" else {trait: True}))
    operator = UserFactory()

    assert run_cancel(run_id=run.pk, actor_id=operator.pk, note="stop")

    after = AgentRun.objects.get(pk=run.pk)
    assert (after.status, after.termination_reason) == (
        Status.CANCELLED,
        TerminationReason.CANCELLED,
    )
    assert after.lease_expires is None
    assert after.pending_turn is None
    assert after.finished_at is not None
    event = AgentRunEvent.objects.get(run=run)
    assert (event.kind, event.actor_id, event.payload) == (
        EventKind.CANCEL,
        operator.pk,
        {"note": "stop"},
    )


@pytest.mark.parametrize("trait", ["completed", "failed", "cancelled"])
def test_cancel_of_a_terminal_run_changes_nothing(trait):
    run = AgentRunFactory(**{trait: True})
    before = snapshot(run.pk)

    assert run_cancel(run_id=run.pk) is False

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_cancel_keeps_the_claim_so_the_holder_notices_it_once():
    lease = start()
    assert run_heartbeat(lease, events=[EventSpec(EventKind.LLM)])

    assert run_cancel(run_id=lease.run_id)

    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.claimed_by, run.lease_epoch) == (ME, 1)
    assert run_heartbeat(lease) is False
    assert (
        run_settle(run_id=lease.run_id, lease=lease, status=Status.COMPLETED, reason="x") is False
    )
    assert wrong_epoch(lease) and run_notice_cancel(wrong_epoch(lease)) is False
    assert run_notice_cancel(wrong_owner(lease)) is False

    assert run_notice_cancel(lease, events=[EventSpec(EventKind.CANCEL, {"noticed": True})])

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.claimed_by == ""
    assert (run.status, run.termination_reason) == (Status.CANCELLED, TerminationReason.CANCELLED)
    assert [e[:3] for e in events(run.pk)] == [
        (0, EventKind.LEASE, ME),
        (1, EventKind.LLM, ME),
        (2, EventKind.CANCEL, ""),
        (3, EventKind.CANCEL, ME),
    ]
    assert run_notice_cancel(lease) is False


def test_notice_cancel_of_a_run_that_is_not_cancelled_is_false():
    lease = start()
    before = snapshot(lease.run_id)

    assert run_notice_cancel(lease, events=[EventSpec(EventKind.CANCEL)]) is False

    assert snapshot(lease.run_id) == before
    assert len(events(lease.run_id)) == 1
