"""Every guarded write of RUNS.md §3.2: what it sets, and each "0 rows" case of its guard.

These run on both databases. A refused write must change nothing: the tests compare the whole
row (and the event stream) before and after.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError
from django.test import override_settings
from django.utils import timezone

from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    SelfApprovalRefused,
    StaleTurn,
    StateWriteFailed,
)
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.transitions import (
    EventSpec,
    Lease,
    run_cancel,
    run_claim_queued,
    run_clear_fence,
    run_decide,
    run_enqueue,
    run_heartbeat,
    run_mark_in_doubt,
    run_notice_cancel,
    run_reclaim_stale,
    run_reconcile_abandon,
    run_requeue,
    run_settle,
    run_stamp_fence,
    run_start,
    run_suspend,
)
from tests.agentruns.factories import (
    AgentConfigurationFactory,
    AgentRunFactory,
    UserFactory,
    lease_for,
)

pytestmark = pytest.mark.django_db

ME = "interactive:host-a:100"
WORKER = "worker:host-b:200"
RESUMER = "resume:host-c:300"
REAPER = "reaper:host-d:400"
CALL = {"id": "call_1_0", "name": "create_note", "arguments": {"title": "t"}}
DIGEST = "a" * 64


# --- helpers -------------------------------------------------------------------------------------


def start(identity: str = ME) -> Lease:
    return run_start(
        configuration=AgentConfigurationFactory(),
        initiator_id=None,
        prompt="hello",
        request={"prompt": "hello"},
        identity=identity,
    )


def snapshot(run_id: int) -> dict[str, Any]:
    return AgentRun.objects.filter(pk=run_id).values().get()


def events(run_id: int) -> list[tuple[int, str, str, int]]:
    return list(
        AgentRunEvent.objects.filter(run_id=run_id)
        .order_by("sequence")
        .values_list("sequence", "kind", "segment", "lease_epoch")
    )


def expire(run_id: int) -> None:
    """Make the lease stale (tests may write the row directly)."""
    AgentRun.objects.filter(pk=run_id).update(lease_expires=timezone.now() - timedelta(minutes=5))


def suspend(lease: Lease, digest: str = DIGEST, status: str = Status.WAITING_FOR_APPROVAL) -> None:
    assert run_suspend(
        lease,
        status=status,
        pending_turn={"kind": "approval", "calls": [CALL], "turn_digest": digest},
        loop_state={"iteration": 1},
    )


def approval(digest: str | None = DIGEST, actor_id: int | None = None) -> EventSpec:
    return EventSpec(
        EventKind.APPROVAL, {"approved": True, "turn_digest": digest}, actor_id=actor_id
    )


def decide(
    run_uuid: Any,
    *,
    digest: str | None = DIGEST,
    identity: str | None = None,
    expected: str = Status.WAITING_FOR_APPROVAL,
    check: Any = None,
):
    return run_decide(
        run_uuid=run_uuid,
        expected_status=expected,
        turn_digest=digest,
        decision={"approved": True},
        event=approval(digest),
        identity=identity,
        check=check,
    )


def reaper_event() -> EventSpec:
    return EventSpec(EventKind.REAPER, {"rule": "test"})


# --- start and enqueue ---------------------------------------------------------------------------


def test_start_claims_at_birth_with_epoch_one_and_a_lease_event_at_sequence_zero():
    before = timezone.now()

    lease = start()

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.RUNNING
    assert run.claimed_by == ME
    assert run.lease_epoch == 1
    assert run.lease_expires > before + timedelta(seconds=30)
    assert run.started_at is not None
    assert run.uuid == lease.uuid
    assert (lease.owner, lease.epoch, lease.next_sequence) == (ME, 1, 1)
    assert events(run.pk) == [(0, EventKind.LEASE, ME, 1)]


@override_settings(AGENTRUNS={"LEASE_SECONDS": 600})
def test_lease_length_is_read_from_settings_at_call_time():
    lease = start()

    assert AgentRun.objects.get(pk=lease.run_id).lease_expires > timezone.now() + timedelta(
        seconds=500
    )


def test_enqueue_inserts_a_queued_run_with_no_claim_and_no_event():
    run = run_enqueue(
        configuration=AgentConfigurationFactory(),
        initiator_id=UserFactory().pk,
        prompt="later",
        request={"prompt": "later"},
    )

    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == Status.QUEUED
    assert (run.claimed_by, run.lease_expires, run.lease_epoch) == ("", None, 0)
    assert run.started_at is None
    assert run.request == {"prompt": "later"}
    assert events(run.pk) == []


# --- claim queued --------------------------------------------------------------------------------


def test_claim_queued_takes_the_run_with_epoch_plus_one():
    run = AgentRunFactory()

    lease = run_claim_queued(run_id=run.pk, identity=WORKER)

    assert lease is not None
    assert (lease.run_id, lease.uuid, lease.owner, lease.epoch) == (run.pk, run.uuid, WORKER, 1)
    after = AgentRun.objects.get(pk=run.pk)
    assert after.status == Status.RUNNING
    assert after.claimed_by == WORKER
    assert after.lease_epoch == 1
    assert after.lease_expires > timezone.now()
    assert after.started_at is not None
    assert events(run.pk) == [(0, EventKind.LEASE, WORKER, 1)]
    assert lease.next_sequence == 1


def test_second_claim_of_the_same_run_gets_none():
    run = AgentRunFactory()
    assert run_claim_queued(run_id=run.pk, identity=WORKER) is not None
    before = snapshot(run.pk)

    assert run_claim_queued(run_id=run.pk, identity="worker:other:2") is None

    assert snapshot(run.pk) == before
    assert len(events(run.pk)) == 1


@pytest.mark.parametrize(
    "trait", ["running", "waiting", "waiting_for_input", "in_doubt", "completed", "cancelled"]
)
def test_claim_queued_refuses_a_run_that_is_not_queued(trait):
    run = AgentRunFactory(**{trait: True})
    before = snapshot(run.pk)

    assert run_claim_queued(run_id=run.pk, identity=WORKER) is None

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_claim_queued_of_a_cancelled_queued_run_gets_none():
    run = AgentRunFactory()
    assert run_cancel(run_id=run.pk)

    assert run_claim_queued(run_id=run.pk, identity=WORKER) is None
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED


def test_claim_queued_of_a_missing_run_gets_none():
    assert run_claim_queued(run_id=987654, identity=WORKER) is None


def test_claim_after_requeue_bumps_the_epoch_keeps_started_at_and_continues_the_sequence():
    run = AgentRunFactory()
    first = run_claim_queued(run_id=run.pk, identity=WORKER)
    started_at = AgentRun.objects.get(pk=run.pk).started_at
    assert run_requeue(first, error={"type": "Timeout"})

    second = run_claim_queued(run_id=run.pk, identity=WORKER)

    assert second is not None and second.epoch == 2
    after = AgentRun.objects.get(pk=run.pk)
    assert after.started_at == started_at
    assert after.requeue_count == 1
    assert events(run.pk) == [(0, EventKind.LEASE, WORKER, 1), (1, EventKind.LEASE, WORKER, 2)]


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


def _wrong_owner(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, "interactive:someone-else:1", lease.epoch, 1)


def _wrong_epoch(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, lease.owner, lease.epoch + 1, 1)


def _older_epoch(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, lease.owner, lease.epoch - 1, 1)


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
    [_wrong_owner, _wrong_epoch, _older_epoch, _suspended, _cancelled, _settled],
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
        "suspend": lambda lease: run_suspend(
            lease,
            status=Status.WAITING_FOR_APPROVAL,
            pending_turn={"turn_digest": "z" * 64},
            loop_state={"zombie": True},
            events=[EventSpec(EventKind.LLM)],
        ),
        "requeue": lambda lease: run_requeue(
            lease, error={"type": "Zombie"}, events=[EventSpec(EventKind.LLM)]
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
        pending_turn={"turn_digest": DIGEST},
        loop_state={"iteration": 1},
        events=[EventSpec(EventKind.LLM)],
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == status
    assert run.pending_turn == {"turn_digest": DIGEST}
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
        run_suspend(lease, status=status, pending_turn={}, loop_state={})

    assert snapshot(lease.run_id) == before


def test_suspend_of_a_cancelled_run_fails_closed():
    lease = start()
    assert run_cancel(run_id=lease.run_id)

    assert (
        run_suspend(lease, status=Status.WAITING_FOR_APPROVAL, pending_turn={"t": 1}, loop_state={})
        is False
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


# --- decide --------------------------------------------------------------------------------------


def waiting_run(digest: str = DIGEST, status: str = Status.WAITING_FOR_APPROVAL) -> Lease:
    lease = start()
    suspend(lease, digest=digest, status=status)
    return lease


def test_decide_inline_resumes_with_epoch_plus_one_and_a_resume_identity():
    lease = waiting_run()
    decider = UserFactory()

    decided = run_decide(
        run_uuid=lease.uuid,
        expected_status=Status.WAITING_FOR_APPROVAL,
        turn_digest=DIGEST,
        decision={"approved": True, "by": decider.pk},
        event=approval(actor_id=decider.pk),
        identity=RESUMER,
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.RUNNING
    assert run.claimed_by == RESUMER
    assert run.lease_epoch == 2
    assert run.lease_expires > timezone.now()
    assert run.pending_turn is None
    assert run.loop_state["decision"] == {"approved": True, "by": decider.pk}
    assert DIGEST in run.loop_state["decided_digests"]
    assert run.loop_state["iteration"] == 1
    assert decided.run.pk == run.pk and decided.run.status == Status.RUNNING
    new = decided.lease
    assert (new.run_id, new.uuid, new.owner, new.epoch) == (run.pk, run.uuid, RESUMER, 2)
    assert events(run.pk)[-1] == (1, EventKind.APPROVAL, RESUMER, 2)
    assert AgentRunEvent.objects.get(run=run, kind=EventKind.APPROVAL).actor_id == decider.pk
    # The returned lease is the one the guards now recognise; the suspended segment's is dead.
    assert new.next_sequence == 2
    assert run_heartbeat(new, events=[EventSpec(EventKind.LLM)])
    assert events(run.pk)[-1] == (2, EventKind.LLM, RESUMER, 2)
    assert run_heartbeat(lease) is False


def test_decide_queued_hands_the_run_to_a_worker():
    lease = waiting_run()

    decided = decide(lease.uuid)

    run = AgentRun.objects.get(pk=lease.run_id)
    assert decided.lease is None
    assert run.status == Status.QUEUED
    assert (run.claimed_by, run.lease_expires, run.lease_epoch) == ("", None, 1)
    assert run.loop_state["decision"] == {"approved": True}
    assert events(run.pk)[-1] == (1, EventKind.APPROVAL, "", 1)
    claimed = run_claim_queued(run_id=run.pk, identity=WORKER)
    assert claimed is not None and claimed.epoch == 2


def test_decide_input_wait():
    lease = waiting_run(status=Status.WAITING_FOR_INPUT)

    decided = decide(lease.uuid, expected=Status.WAITING_FOR_INPUT, identity=RESUMER)

    assert decided.run.status == Status.RUNNING


def test_decide_reconciliation_resolves_the_fence():
    run = AgentRunFactory(in_doubt=True)

    decided = decide(run.uuid, digest="r" * 64, expected=Status.WAITING_FOR_RECONCILIATION)

    after = AgentRun.objects.get(pk=run.pk)
    assert decided.run.status == Status.QUEUED
    assert (after.pending_effect, after.pending_call, after.pending_turn) == ("", None, None)


@pytest.mark.parametrize("digest", [None, ""], ids=["none", "empty"])
def test_decide_without_a_digest_is_a_stale_turn(digest):
    lease = waiting_run()
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    with pytest.raises(StaleTurn):
        decide(lease.uuid, digest=digest, identity=RESUMER)

    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events


def test_decide_with_a_stale_digest_is_a_stale_turn():
    lease = waiting_run()
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    with pytest.raises(StaleTurn):
        decide(lease.uuid, digest="b" * 64, identity=RESUMER)

    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events


@pytest.mark.parametrize("first_inline", [True, False], ids=["after-inline", "after-queued"])
def test_second_decision_on_the_same_turn_is_already_decided(first_inline):
    lease = waiting_run()
    decide(lease.uuid, identity=RESUMER if first_inline else None)
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    with pytest.raises(AlreadyDecided):
        decide(lease.uuid, identity="resume:other:9")

    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events


def test_decision_for_an_old_turn_on_a_new_wait_is_already_decided():
    lease = waiting_run()
    decided = decide(lease.uuid, identity=RESUMER)
    # The continuing segment carries the loop state it resumed from into its next pause.
    assert run_suspend(
        decided.lease,
        status=Status.WAITING_FOR_APPROVAL,
        pending_turn={"turn_digest": "c" * 64},
        loop_state=decided.run.loop_state,
    )
    before = snapshot(lease.run_id)

    with pytest.raises(AlreadyDecided):
        decide(lease.uuid, digest=DIGEST, identity=RESUMER)

    assert snapshot(lease.run_id) == before


def test_decision_for_an_old_turn_is_refused_even_if_the_segment_dropped_its_history():
    lease = waiting_run()
    new = decide(lease.uuid, identity=RESUMER).lease
    suspend(new, digest="c" * 64)  # loop_state without "decided_digests"
    before = snapshot(lease.run_id)

    with pytest.raises(StaleTurn):
        decide(lease.uuid, digest=DIGEST, identity=RESUMER)

    assert snapshot(lease.run_id) == before


@pytest.mark.parametrize("trait", ["queued", "running", "completed", "cancelled", "in_doubt"])
def test_decide_on_a_run_that_is_not_waiting_for_approval_is_not_waiting(trait):
    run = AgentRunFactory(**({} if trait == "queued" else {trait: True}))
    before = snapshot(run.pk)

    with pytest.raises(NotWaiting):
        decide(run.uuid, digest="r" * 64, identity=RESUMER)

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_decide_with_the_wrong_kind_of_wait_is_not_waiting():
    lease = waiting_run(status=Status.WAITING_FOR_INPUT)
    before = snapshot(lease.run_id)

    with pytest.raises(NotWaiting):
        decide(lease.uuid, expected=Status.WAITING_FOR_APPROVAL)

    assert snapshot(lease.run_id) == before


def test_decide_on_a_cancelled_wait_is_not_waiting():
    lease = waiting_run()
    assert run_cancel(run_id=lease.run_id)
    before = snapshot(lease.run_id)

    with pytest.raises(NotWaiting):
        decide(lease.uuid, identity=RESUMER)

    assert snapshot(lease.run_id) == before


@pytest.mark.parametrize("run_uuid", [uuid.uuid4(), str(uuid.uuid4()), "not-a-uuid", ""])
def test_decide_on_a_missing_run_is_run_not_found(run_uuid):
    with pytest.raises(RunNotFound):
        decide(run_uuid, identity=RESUMER)


def test_a_refusing_check_changes_nothing_and_writes_no_event():
    lease = waiting_run()
    before, before_events = snapshot(lease.run_id), events(lease.run_id)
    seen = []

    def four_eyes(run: AgentRun) -> None:
        seen.append((run.pk, run.status))
        raise SelfApprovalRefused()

    with pytest.raises(SelfApprovalRefused):
        decide(lease.uuid, identity=RESUMER, check=four_eyes)

    assert seen == [(lease.run_id, Status.WAITING_FOR_APPROVAL)]
    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events
    # Refused is not decided: the turn can still be decided afterwards.
    assert decide(lease.uuid, identity=RESUMER).run.status == Status.RUNNING


def test_the_check_is_not_consulted_for_a_refused_turn():
    lease = waiting_run()

    def must_not_run(run: AgentRun) -> None:
        raise AssertionError("check ran for a stale turn")

    with pytest.raises(StaleTurn):
        decide(lease.uuid, digest="b" * 64, check=must_not_run)


def test_the_decision_event_exists_iff_the_decision_took_effect():
    lease = waiting_run()
    outcomes = []
    for digest in ("b" * 64, None, DIGEST, DIGEST, "b" * 64):
        try:
            decide(lease.uuid, digest=digest, identity=RESUMER)
            outcomes.append("decided")
        except (StaleTurn, AlreadyDecided, NotWaiting) as exc:
            outcomes.append(exc.code)

    assert outcomes == ["stale_turn", "stale_turn", "decided", "already_decided", "not_waiting"]
    approvals = AgentRunEvent.objects.filter(run_id=lease.run_id, kind=EventKind.APPROVAL)
    assert list(approvals.values_list("payload__turn_digest", flat=True)) == [DIGEST]


# --- reconcile abandon ---------------------------------------------------------------------------


def test_reconcile_abandon_settles_failed_and_records_the_verdict():
    run = AgentRunFactory(in_doubt=True)
    operator = UserFactory()

    after = run_reconcile_abandon(
        run_uuid=run.uuid,
        turn_digest="r" * 64,
        event=EventSpec(EventKind.RECONCILIATION, {"verdict": "abandon"}, actor_id=operator.pk),
    )

    assert after.status == Status.FAILED
    assert after.termination_reason == TerminationReason.RECONCILED_ABANDONED
    assert (after.claimed_by, after.lease_expires, after.pending_effect, after.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert after.pending_turn is None
    assert after.finished_at is not None
    assert events(run.pk) == [(0, EventKind.RECONCILIATION, "", 1)]
    assert AgentRunEvent.objects.get(run=run).actor_id == operator.pk


@pytest.mark.parametrize(
    ("trait", "digest", "error"),
    [
        ("in_doubt", "x" * 64, StaleTurn),
        ("in_doubt", None, StaleTurn),
        ("waiting", "d" * 64, NotWaiting),
        ("running", "r" * 64, NotWaiting),
        ("completed", "r" * 64, NotWaiting),
    ],
)
def test_reconcile_abandon_guard(trait, digest, error):
    run = AgentRunFactory(**{trait: True})
    before = snapshot(run.pk)

    with pytest.raises(error):
        run_reconcile_abandon(
            run_uuid=run.uuid, turn_digest=digest, event=EventSpec(EventKind.RECONCILIATION)
        )

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_reconcile_abandon_twice_is_already_decided():
    run = AgentRunFactory(in_doubt=True)
    run_reconcile_abandon(
        run_uuid=run.uuid, turn_digest="r" * 64, event=EventSpec(EventKind.RECONCILIATION)
    )
    before = snapshot(run.pk)

    with pytest.raises(AlreadyDecided):
        run_reconcile_abandon(
            run_uuid=run.uuid, turn_digest="r" * 64, event=EventSpec(EventKind.RECONCILIATION)
        )

    assert snapshot(run.pk) == before
    assert len(events(run.pk)) == 1


def test_reconcile_abandon_refused_by_check_changes_nothing():
    run = AgentRunFactory(in_doubt=True)
    before = snapshot(run.pk)

    def refuse(run: AgentRun) -> None:
        raise SelfApprovalRefused()

    with pytest.raises(SelfApprovalRefused):
        run_reconcile_abandon(
            run_uuid=run.uuid,
            turn_digest="r" * 64,
            event=EventSpec(EventKind.RECONCILIATION),
            check=refuse,
        )

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_reconcile_abandon_of_a_missing_run():
    with pytest.raises(RunNotFound):
        run_reconcile_abandon(
            run_uuid=uuid.uuid4(), turn_digest="r" * 64, event=EventSpec(EventKind.RECONCILIATION)
        )


# --- reclaim stale -------------------------------------------------------------------------------


def test_reclaim_stale_queues_the_run_with_budget_plus_one():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event())

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.QUEUED
    assert run.requeue_count == 1
    assert (run.claimed_by, run.lease_expires, run.pending_effect, run.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert run.lease_epoch == 1
    assert events(run.pk)[-1] == (1, EventKind.REAPER, REAPER, 0)


def test_reclaim_stale_of_a_live_lease_is_false():
    lease = start()
    before = snapshot(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is False

    assert snapshot(lease.run_id) == before
    assert len(events(lease.run_id)) == 1


def test_reclaim_stale_rechecks_staleness_in_the_update():
    """The reaper saw the run stale; the holder renewed before the reclaim: skip it."""
    lease = start()
    expire(lease.run_id)
    seen_stale = list(
        AgentRun.objects.filter(status=Status.RUNNING, lease_expires__lt=timezone.now())
    )
    assert [r.pk for r in seen_stale] == [lease.run_id]
    assert run_heartbeat(lease)
    before = snapshot(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is False

    assert snapshot(lease.run_id) == before
    assert run_heartbeat(lease)


@override_settings(AGENTRUNS={"LEASE_SECONDS": -1})
def test_a_lease_granted_for_negative_seconds_is_stale_at_once():
    lease = start()

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event())


@pytest.mark.parametrize("trait", ["waiting", "in_doubt", "completed", "cancelled"])
def test_reclaim_stale_only_touches_running_runs(trait):
    run = AgentRunFactory(**{trait: True}, lease_expires=timezone.now() - timedelta(minutes=5))
    before = snapshot(run.pk)

    assert run_reclaim_stale(run_id=run.pk, segment=REAPER, event=reaper_event()) is False

    assert snapshot(run.pk) == before


def test_reclaim_stale_of_a_queued_run_is_false():
    run = AgentRunFactory()

    assert run_reclaim_stale(run_id=run.pk, segment=REAPER, event=reaper_event()) is False
    assert AgentRun.objects.get(pk=run.pk).requeue_count == 0


# --- mark in doubt -------------------------------------------------------------------------------


IN_DOUBT_TURN = {"kind": "reconciliation", "turn_digest": "r" * 64}


def test_mark_in_doubt_parks_a_stale_non_idempotent_write_for_a_human():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)

    assert run_mark_in_doubt(
        run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert (run.claimed_by, run.lease_expires) == ("", None)
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert run.pending_call == CALL
    assert run.pending_turn == IN_DOUBT_TURN
    assert run.requeue_count == 0
    assert events(run.pk)[-1] == (1, EventKind.REAPER, REAPER, 0)
    # The dead segment cannot clear the fence it left behind.
    assert run_clear_fence(lease) is False


@pytest.mark.parametrize("effect", ["", Effect.READ, Effect.IDEMPOTENT_WRITE])
def test_mark_in_doubt_needs_a_non_idempotent_fence(effect):
    lease = start()
    if effect:
        assert run_stamp_fence(lease, effect=effect, call=CALL)
    expire(lease.run_id)
    before = snapshot(lease.run_id)

    assert (
        run_mark_in_doubt(
            run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )

    assert snapshot(lease.run_id) == before


def test_mark_in_doubt_of_a_live_lease_is_false():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    before = snapshot(lease.run_id)

    assert (
        run_mark_in_doubt(
            run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )

    assert snapshot(lease.run_id) == before


def test_mark_in_doubt_of_a_cancelled_fenced_run_is_false():
    run = AgentRunFactory(
        cancelled=True, fenced=True, lease_expires=timezone.now() - timedelta(minutes=5)
    )
    before = snapshot(run.pk)

    assert (
        run_mark_in_doubt(
            run_id=run.pk, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )
    assert snapshot(run.pk) == before


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
    assert _wrong_epoch(lease) and run_notice_cancel(_wrong_epoch(lease)) is False
    assert run_notice_cancel(_wrong_owner(lease)) is False

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


# --- the zombie ----------------------------------------------------------------------------------


@pytest.mark.parametrize("new_identity", [ME, WORKER], ids=["same-identity", "other-identity"])
@SEGMENT_WRITES
def test_zombie_writes_match_nothing_while_the_new_holder_succeeds(new_identity, write):
    old = start()
    assert run_heartbeat(old, events=[EventSpec(EventKind.LLM)])
    expire(old.run_id)
    assert run_reclaim_stale(run_id=old.run_id, segment=REAPER, event=reaper_event())
    new = run_claim_queued(run_id=old.run_id, identity=new_identity)
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


# --- database errors -----------------------------------------------------------------------------


def test_a_check_constraint_violation_becomes_state_write_failed_and_rolls_back():
    lease = start()
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    with pytest.raises(StateWriteFailed) as caught:
        run_settle(
            run_id=lease.run_id,
            lease=lease,
            status=Status.COMPLETED,
            reason=TerminationReason.COMPLETED,
            totals={"prompt_tokens": -1},
            events=[EventSpec(EventKind.LLM)],
        )

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert caught.value.detail == {"transition": "run_settle"}
    assert caught.value.code == "state_write_failed"
    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events
    assert lease.next_sequence == 1


def test_an_event_sequence_collision_rolls_back_the_guarded_update():
    """A segment whose event counter fell behind: the insert fails, so the UPDATE is undone."""
    lease = start()
    AgentRunEvent.objects.create(run_id=lease.run_id, sequence=1, kind=EventKind.TOOL)
    before = snapshot(lease.run_id)

    with pytest.raises(StateWriteFailed) as caught:
        run_heartbeat(lease, loop_state={"iteration": 9}, events=[EventSpec(EventKind.LLM)])

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert caught.value.detail == {"transition": "run_heartbeat"}
    assert snapshot(lease.run_id) == before
    assert lease.next_sequence == 1


@pytest.mark.django_db(transaction=True)
def test_a_foreign_key_violation_at_birth_becomes_state_write_failed():
    """Foreign keys are checked at commit (deferred): the transition's own transaction fails."""
    config = AgentConfigurationFactory()
    count = AgentRun.objects.count()

    with pytest.raises(StateWriteFailed) as caught:
        run_start(
            configuration=config,
            initiator_id=987654,
            prompt="p",
            request={},
            identity=ME,
        )

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert AgentRun.objects.count() == count
