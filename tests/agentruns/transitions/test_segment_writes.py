"""A segment's own writes (docs/design.md §2.3): heartbeat, fence, suspend, requeue, hand-back —
and every one of them, made with a lost lease or by a zombie whose run was reclaimed, matching
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status, TerminationReason
from agentruns.transitions import (
    run_cancel,
    run_clear_fence,
    run_hand_back,
    run_heartbeat,
    run_reclaim_stale,
    run_requeue,
    run_settle,
    run_stamp_fence,
    run_suspend,
)
from tests.agentruns.factories import AgentRunFactory, lease_for
from tests.agentruns.support.transitions import (
    CALL,
    ME,
    REAPER,
    WORKER,
    approval_turn,
    claim_lease,
    events,
    expire,
    older_epoch,
    reaper_event,
    snapshot,
    start,
    suspend,
    wrong_epoch,
    wrong_owner,
)

pytestmark = pytest.mark.django_db


# --- heartbeat -----------------------------------------------------------------------------------


def test_heartbeat_renews_the_lease_saves_loop_state_and_appends_events():
    lease = start()
    expire(lease.run_id)

    assert run_heartbeat(
        lease,
        loop_state={"iteration": 2},
        events=[EventSpec(EventKind.LLM, {"content": "hi"}, duration_ms=5)],
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.lease_expires > timezone.now()
    assert run.loop_state == {"iteration": 2}
    assert events(run.pk) == [(0, EventKind.LEASE, ME, 1), (1, EventKind.LLM, ME, 1)]
    assert lease.next_sequence == 2


def test_heartbeat_without_loop_state_keeps_it():
    lease = start()
    assert run_heartbeat(lease, loop_state={"iteration": 3})

    assert run_heartbeat(lease)

    assert AgentRun.objects.get(pk=lease.run_id).loop_state == {"iteration": 3}


def _suspended(lease: Lease) -> Lease:
    suspend(lease)
    return lease


def _cancelled(lease: Lease) -> Lease:
    assert run_cancel(run_id=lease.run_id)
    return lease


def _settled(lease: Lease) -> Lease:
    assert run_settle(run_id=lease.run_id, status=Status.FAILED, reason="provider_failed")
    return lease


LOST_LEASES = pytest.mark.parametrize(
    "lose",
    [wrong_owner, wrong_epoch, older_epoch, _suspended, _cancelled, _settled],
    ids=["wrong-owner", "newer-epoch", "older-epoch", "not-running", "cancelled", "settled"],
)


def _segment_writes() -> dict[str, Any]:
    """Every owner-guarded write a segment makes, as ``name -> call(lease)``."""
    return {
        "heartbeat": lambda lease: run_heartbeat(
            lease, loop_state={"zombie": True}, events=[EventSpec(EventKind.LLM)]
        ),
        "stamp_fence": lambda lease: run_stamp_fence(
            lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL, loop_state={"zombie": True}
        ),
        "clear_fence": lambda lease: run_clear_fence(
            lease, loop_state={"zombie": True}, events=[EventSpec(EventKind.TOOL)]
        ),
        "suspend": lambda lease: (
            run_suspend(
                lease,
                status=Status.WAITING_FOR_APPROVAL,
                pending_turn=approval_turn("z" * 64),
                loop_state={"zombie": True},
                events=[EventSpec(EventKind.LLM)],
            )
            is not None
        ),  # the parked row, or None
        "requeue": lambda lease: run_requeue(
            lease, error={"type": "Zombie"}, events=[EventSpec(EventKind.LLM)]
        ),
        "hand_back": lambda lease: run_hand_back(
            lease, loop_state={"zombie": True}, events=[EventSpec(EventKind.LEASE)]
        ),
        "settle": lambda lease: run_settle(
            run_id=lease.run_id,
            lease=lease,
            status=Status.COMPLETED,
            reason=TerminationReason.COMPLETED,
            output="zombie",
            events=[EventSpec(EventKind.LLM)],
        ),
    }


SEGMENT_WRITES = pytest.mark.parametrize("write", list(_segment_writes()))


@LOST_LEASES
@SEGMENT_WRITES
def test_segment_write_with_a_lost_lease_matches_nothing(lose, write):
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.IDEMPOTENT_WRITE, call=CALL)
    lost = lose(lease)
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    assert _segment_writes()[write](lost) is False

    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events


@LOST_LEASES
def test_heartbeat_with_a_lost_lease_does_not_advance_the_event_counter(lose):
    lost = lose(start())
    counter = lost.next_sequence

    assert run_heartbeat(lost, events=[EventSpec(EventKind.LLM)]) is False

    assert lost.next_sequence == counter


def test_a_holder_whose_lease_expired_but_was_not_reclaimed_may_renew_it():
    run = AgentRunFactory(stale=True)
    lease = lease_for(run)

    assert run_heartbeat(lease)

    assert AgentRun.objects.get(pk=run.pk).lease_expires > timezone.now()
    assert run_reclaim_stale(run_id=run.pk, segment=REAPER, event=reaper_event()) is False


# --- fence ---------------------------------------------------------------------------------------


def test_stamp_fence_records_the_write_in_flight_and_renews_the_lease():
    lease = start()
    expire(lease.run_id)

    assert run_stamp_fence(
        lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL, loop_state={"executing": "call_1_0"}
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert run.pending_call == CALL
    assert run.loop_state == {"executing": "call_1_0"}
    assert run.lease_expires > timezone.now()


def test_clear_fence_empties_it_renews_the_lease_and_appends_the_tool_event():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)

    assert run_clear_fence(lease, events=[EventSpec(EventKind.TOOL, {"call_id": "call_1_0"})])

    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.pending_effect, run.pending_call) == ("", None)
    assert run.lease_expires > timezone.now()
    assert events(run.pk)[-1] == (1, EventKind.TOOL, ME, 1)


# --- suspend -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT])
def test_suspend_parks_the_run_and_releases_the_claim(status):
    lease = start()

    assert run_suspend(
        lease,
        status=status,
        pending_turn=approval_turn(),
        loop_state={"iteration": 1},
        events=[EventSpec(EventKind.LLM)],
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == status
    assert run.pending_turn == approval_turn().to_json()
    assert run.loop_state == {"iteration": 1}
    assert (run.claimed_by, run.lease_expires) == ("", None)
    assert run.lease_epoch == 1
    assert events(run.pk)[-1] == (1, EventKind.LLM, ME, 1)


@pytest.mark.parametrize(
    "status",
    [Status.QUEUED, Status.RUNNING, Status.WAITING_FOR_RECONCILIATION, Status.COMPLETED, "nap"],
)
def test_suspend_refuses_a_status_that_is_not_a_human_wait(status):
    lease = start()
    before = snapshot(lease.run_id)

    with pytest.raises(ValueError):
        run_suspend(lease, status=status, pending_turn=approval_turn(), loop_state={})

    assert snapshot(lease.run_id) == before


def test_suspend_of_a_cancelled_run_fails_closed():
    lease = start()
    assert run_cancel(run_id=lease.run_id)

    assert (
        run_suspend(
            lease, status=Status.WAITING_FOR_APPROVAL, pending_turn=approval_turn(), loop_state={}
        )
        is None
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.CANCELLED
    assert run.pending_turn is None


# --- requeue -------------------------------------------------------------------------------------


def test_requeue_hands_the_run_back_with_budget_plus_one_and_clears_claim_and_fence():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.IDEMPOTENT_WRITE, call=CALL)

    assert run_requeue(lease, error={"type": "RateLimited"})

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.QUEUED
    assert run.requeue_count == 1
    assert (run.claimed_by, run.lease_expires, run.pending_effect, run.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert run.error == {"type": "RateLimited"}
    assert run.lease_epoch == 1


def test_hand_back_queues_the_run_without_spending_budget_and_clears_claim_and_fence():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    done = EventSpec(EventKind.TOOL, {"name": "t", "outcome": "executed"})
    back = EventSpec(EventKind.LEASE, {"action": "handed_back", "at": "round"})

    assert run_hand_back(lease, loop_state={"iteration": 1}, events=[done, back])

    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.requeue_count, run.lease_epoch) == (Status.QUEUED, 0, 1)
    assert (run.claimed_by, run.lease_expires, run.pending_effect, run.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert run.loop_state == {"iteration": 1}
    assert [kind for _, kind, _, _ in events(lease.run_id)][-2:] == [
        EventKind.TOOL,
        EventKind.LEASE,
    ]
    again = claim_lease(run_id=run.pk, identity=WORKER)
    assert again is not None and again.epoch == 2


# --- the zombie ----------------------------------------------------------------------------------


@pytest.mark.parametrize("new_identity", [ME, WORKER], ids=["same-identity", "other-identity"])
@SEGMENT_WRITES
def test_zombie_writes_match_nothing_while_the_new_holder_succeeds(new_identity, write):
    old = start()
    assert run_heartbeat(old, events=[EventSpec(EventKind.LLM)])
    expire(old.run_id)
    assert run_reclaim_stale(run_id=old.run_id, segment=REAPER, event=reaper_event())
    new = claim_lease(run_id=old.run_id, identity=new_identity)
    assert new is not None and new.epoch == old.epoch + 1
    assert new.next_sequence == 4
    before, before_events = snapshot(old.run_id), events(old.run_id)

    assert _segment_writes()[write](old) is False

    assert snapshot(old.run_id) == before
    assert events(old.run_id) == before_events
    assert _segment_writes()[write](new) is True
    assert all(epoch == new.epoch for *_, epoch in events(old.run_id)[len(before_events) :])


def test_zombie_whose_run_was_reclaimed_but_not_yet_claimed_matches_nothing():
    old = start()
    expire(old.run_id)
    assert run_reclaim_stale(run_id=old.run_id, segment=REAPER, event=reaper_event())
    before = snapshot(old.run_id)

    for name, write in _segment_writes().items():
        assert write(old) is False, name

    assert snapshot(old.run_id) == before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # autocommit, as in production
@pytest.mark.parametrize("await_commit", [False, True], ids=["autocommit", "own-commit"])
def test_a_boundary_is_one_autocommit_statement_unless_it_must_commit_itself(await_commit):
    """On PostgreSQL a boundary with events is one data-modifying CTE in autocommit; the clear
    of a non-idempotent write's fence commits itself (a death before the COMMIT undoes it)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    lease = start()
    with CaptureQueriesContext(connection) as captured:
        assert run_clear_fence(
            lease, events=[EventSpec(EventKind.TOOL)], in_doubt_unless_committed=await_commit
        )

    kinds = [q["sql"].split(None, 1)[0].upper() for q in captured.captured_queries]
    assert kinds == (["BEGIN", "WITH", "COMMIT"] if await_commit else ["WITH"])
    assert AgentRunEvent.objects.filter(run_id=lease.run_id, kind=EventKind.TOOL).count() == 1
    assert AgentRun.objects.get(pk=lease.run_id).next_sequence == lease.next_sequence == 2
