"""Human decisions (docs/design.md §2.3, §5.4): ``run_decide`` on approval, input and reconciliation
waits, and ``run_reconcile_abandon`` — stale turns, double decisions, refusing checks."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.utils import timezone

from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    SelfApprovalRefused,
    StaleTurn,
)
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status, TerminationReason
from agentruns.transitions import (
    locked_waiting_run,
    record_abandon,
    record_decision,
    run_cancel,
    run_decide,
    run_heartbeat,
    run_reconcile_abandon,
    run_suspend,
)
from agentruns.turns import ApprovalDecision, InputDecision
from tests.agentruns.factories import (
    IN_DOUBT_DIGEST,
    INPUT_DIGEST,
    INPUT_STATE,
    INPUT_TURN,
    WAITING_DIGEST,
    AgentRunFactory,
    UserFactory,
)
from tests.agentruns.support.transitions import (
    DIGEST,
    WORKER,
    approval_turn,
    claim_lease,
    events,
    snapshot,
    start,
    suspend,
)

pytestmark = pytest.mark.django_db

RESUMER = "resume:host-c:300"


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
    """``run_decide``; with ``check``, the service's plain order instead: lock, ``check`` the
    locked row, record."""
    if check is None:
        return run_decide(
            run_uuid=run_uuid,
            expected_status=expected,
            turn_digest=digest,
            decision=ApprovalDecision(approved=True),
            event=approval(digest),
            identity=identity,
        )
    with locked_waiting_run(run_uuid, expected_status=expected, turn_digest=digest) as run:
        check(run)
        return record_decision(
            run,
            expected_status=expected,
            turn_digest=digest,
            decision=ApprovalDecision(approved=True),
            event=approval(digest),
            identity=identity,
        )


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
        decision=ApprovalDecision(approved=True, decider_id=decider.pk),
        event=approval(actor_id=decider.pk),
        identity=RESUMER,
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.RUNNING
    assert run.claimed_by == RESUMER
    assert run.lease_epoch == 2
    assert run.lease_expires > timezone.now()
    assert run.pending_turn is None
    assert run.loop_state["decision"] == {
        "kind": "approval",
        "approved": True,
        "decider_id": decider.pk,
        "turn_digest": "",
    }
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


def test_an_inline_decision_hands_on_the_run_s_events_as_the_table_holds_them():
    """Issue 30: on PostgreSQL the inline decision's statement also reads the run's events
    under the row lock, so the continuation rebuilds its dialogue without reading them again:
    they are exactly the stored ones, the decision's own included, payloads as read back. On
    SQLite none are handed on (the continuation reads them)."""
    from django.db import connection

    lease = start()
    assert run_heartbeat(lease, events=[EventSpec(EventKind.LLM, {"content": "é", "n": 1.5})])
    suspend(lease)

    decided = decide(lease.uuid, identity=RESUMER)

    if connection.vendor != "postgresql":
        assert decided.events is None
        return
    stored = AgentRunEvent.objects.filter(run_id=lease.run_id).order_by("sequence")
    assert [(e.sequence, e.kind, e.payload) for e in decided.events] == [
        (e.sequence, e.kind, e.payload) for e in stored
    ]
    assert decided.events[-1].kind == EventKind.APPROVAL
    assert decided.events[-1].sequence == decided.lease.next_sequence - 1


def test_a_queued_decision_hands_on_no_events():
    lease = waiting_run()

    assert decide(lease.uuid).events is None


def test_decide_queued_hands_the_run_to_a_worker():
    lease = waiting_run()

    decided = decide(lease.uuid)

    run = AgentRun.objects.get(pk=lease.run_id)
    assert decided.lease is None
    assert run.status == Status.QUEUED
    assert (run.claimed_by, run.lease_expires, run.lease_epoch) == ("", None, 1)
    assert run.loop_state["decision"] == ApprovalDecision(approved=True).to_json()
    assert events(run.pk)[-1] == (1, EventKind.APPROVAL, "", 1)
    claimed = claim_lease(run_id=run.pk, identity=WORKER)
    assert claimed is not None and claimed.epoch == 2


def test_decide_input_wait():
    lease = start()
    assert run_suspend(
        lease,
        status=Status.WAITING_FOR_INPUT,
        pending_turn=INPUT_TURN,
        loop_state=INPUT_STATE.to_json(),
    )

    decided = run_decide(
        run_uuid=lease.uuid,
        expected_status=Status.WAITING_FOR_INPUT,
        turn_digest=INPUT_DIGEST,
        decision=InputDecision(call_id="call_0_0", values={}),
        event=EventSpec(EventKind.INPUT),
        identity=RESUMER,
    )

    assert decided.run.status == Status.RUNNING


def test_decide_reconciliation_resolves_the_fence():
    run = AgentRunFactory(in_doubt=True)

    decided = decide(run.uuid, digest=IN_DOUBT_DIGEST, expected=Status.WAITING_FOR_RECONCILIATION)

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
        pending_turn=approval_turn("c" * 64),
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
        decide(run.uuid, digest=IN_DOUBT_DIGEST, identity=RESUMER)

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
        turn_digest=IN_DOUBT_DIGEST,
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
        ("waiting", WAITING_DIGEST, NotWaiting),
        ("running", IN_DOUBT_DIGEST, NotWaiting),
        ("completed", IN_DOUBT_DIGEST, NotWaiting),
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
        run_uuid=run.uuid, turn_digest=IN_DOUBT_DIGEST, event=EventSpec(EventKind.RECONCILIATION)
    )
    before = snapshot(run.pk)

    with pytest.raises(AlreadyDecided):
        run_reconcile_abandon(
            run_uuid=run.uuid,
            turn_digest=IN_DOUBT_DIGEST,
            event=EventSpec(EventKind.RECONCILIATION),
        )

    assert snapshot(run.pk) == before
    assert len(events(run.pk)) == 1


def test_reconcile_abandon_refused_by_check_changes_nothing():
    run = AgentRunFactory(in_doubt=True)
    before = snapshot(run.pk)

    def refuse(run: AgentRun) -> None:
        raise SelfApprovalRefused()

    with (
        pytest.raises(SelfApprovalRefused),
        locked_waiting_run(
            run.uuid, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=IN_DOUBT_DIGEST
        ) as locked,
    ):
        refuse(locked)
        record_abandon(
            locked, turn_digest=IN_DOUBT_DIGEST, event=EventSpec(EventKind.RECONCILIATION)
        )

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_reconcile_abandon_of_a_missing_run():
    with pytest.raises(RunNotFound):
        run_reconcile_abandon(
            run_uuid=uuid.uuid4(),
            turn_digest=IN_DOUBT_DIGEST,
            event=EventSpec(EventKind.RECONCILIATION),
        )
