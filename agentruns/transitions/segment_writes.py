"""A segment's own transitions: births, claims, the heartbeat, the fence, suspending and handing
back to the queue. Each is owner-guarded; ``False`` means the lease is lost."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from agentruns import ledger
from agentruns.leases import Claimed, EventSpec, Lease
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    Status,
)
from agentruns.transitions import _claim
from agentruns.transitions._sql import RUN_FIELDS, insert_events
from agentruns.transitions._writer import (
    DbValue,
    Later,
    guarded_write,
    lease_deadline,
    segment_write,
    state_write,
)
from agentruns.transitions.deadlines import WaitDeadline
from agentruns.turns import (
    PendingTurn,
)

# --- Births ------------------------------------------------------------------------------------


def birth_event() -> EventSpec:
    """The ``lease`` event ``run_start`` writes with a run claimed at birth."""
    return EventSpec(EventKind.LEASE, {"action": "claimed_at_birth"})


@state_write
def run_start(
    *,
    configuration: AgentConfiguration,
    initiator_id: int | None,
    prompt: str,
    request: Mapping[str, Any],
    identity: str,
) -> Lease:
    """Insert a ``running`` run claimed at birth by ``identity`` with epoch 1."""
    run_uuid = uuid.uuid4()
    born = [birth_event()]
    links, head = ledger.chain(
        run_uuid=run_uuid,
        prev_hash=ledger.genesis(run_uuid),
        first_sequence=0,
        segment=identity,
        lease_epoch=1,
        events=born,
    )
    with transaction.atomic():
        run = AgentRun.objects.create(
            uuid=run_uuid,
            configuration=configuration,
            initiator_id=initiator_id,
            prompt=prompt,
            request=dict(request),
            status=Status.RUNNING,
            claimed_by=identity,
            lease_expires=lease_deadline(),
            lease_epoch=1,
            started_at=Now(),
            **{ledger.HEAD_FIELD: head, ledger.SEQUENCE_FIELD: len(born)},
        )
        end = insert_events(run.pk, 0, identity, 1, born, links)
    return Lease(run.pk, run_uuid, identity, 1, next_sequence=end, head=head)


@state_write
def run_enqueue(
    *,
    configuration: AgentConfiguration,
    initiator_id: int | None,
    prompt: str,
    request: Mapping[str, Any],
) -> AgentRun:
    """Insert a ``queued`` run with no claim. The caller sends the wake-up after commit."""
    run_uuid = uuid.uuid4()
    return AgentRun.objects.create(
        uuid=run_uuid,
        **{ledger.HEAD_FIELD: ledger.genesis(run_uuid)},
        configuration=configuration,
        initiator_id=initiator_id,
        prompt=prompt,
        request=dict(request),
        status=Status.QUEUED,
    )


# --- Claims, heartbeat, fence --------------------------------------------------------------------


#: How often a claim reads the run again when its guard matched a queued run that changed
#: between the read and the claim (a reaper's redispatch appends an event to a queued run).
CLAIM_ATTEMPTS = 3


@state_write
def run_claim_queued(
    *, identity: str, run_id: int | None = None, run_uuid: UUID | str | None = None
) -> Lease | None:
    """Claim a ``queued`` run, named by ``run_id`` or ``run_uuid``: ``running``, a lease for
    ``identity``, epoch + 1 (``run_claim_queued_row``, without the row)."""
    claimed = run_claim_queued_row(identity=identity, run_id=run_id, run_uuid=run_uuid)
    return None if claimed is None else claimed.lease


@state_write
def run_claim_queued_row(
    *, identity: str, run_id: int | None = None, run_uuid: UUID | str | None = None
) -> Claimed | None:
    """Claim a ``queued`` run, named by ``run_id`` or ``run_uuid``: ``running``, a lease for
    ``identity`` until the database clock plus ``LEASE_SECONDS``, epoch + 1, and a ``lease``
    event. Returns the lease with the row as the claim left it and its configuration (and, on a
    run's first claim, its events: the claim's own), so the segment reads none of them again.

    A compare-and-set on ``(status, lease_epoch, next_sequence, ledger_head)`` in one statement
    (``_claim``): of any number of concurrent claimers exactly one matches. A run named by uuid
    is first tried as never claimed (no read); otherwise, or when that matches nothing, the row
    is read and the guard tried with what it holds. ``None`` means another worker won, the run
    is no longer queued (cancelled, already running, terminal) or there is no such run: do
    nothing.
    """
    if (run_id is None) == (run_uuid is None):
        raise ValueError("name the run by run_id or by run_uuid")
    events = [EventSpec(EventKind.LEASE, {"action": "claimed"})]
    if run_uuid is not None:
        try:
            named = RUN_FIELDS["uuid"].to_python(run_uuid)
        except ValidationError:  # not a uuid: there is no such run
            return None
        if named is None:
            return None
        tail = _claim.Tail.unclaimed(named)
        claimed = _claim.claim(
            by="uuid", value=named, run_uuid=named, tail=tail, identity=identity, events=events
        )
        if claimed is not None:
            return _claimed(claimed, tail, events)
        where = Q(uuid=named)
    else:
        where = Q(pk=run_id)
    fields = ("pk", "uuid", "status", "lease_epoch", ledger.SEQUENCE_FIELD, ledger.HEAD_FIELD)
    for _ in range(CLAIM_ATTEMPTS):
        try:
            row = AgentRun.objects.filter(where).values(*fields).first()
        except (ValidationError, ValueError):  # not an id: there is no such run
            return None
        if row is None or row["status"] != Status.QUEUED:
            return None
        tail = _claim.Tail(
            row["lease_epoch"], row[ledger.SEQUENCE_FIELD], row[ledger.HEAD_FIELD], row["uuid"]
        )
        claimed = _claim.claim(
            by="id",
            value=row["pk"],
            run_uuid=row["uuid"],
            tail=tail,
            identity=identity,
            events=events,
        )
        if claimed is not None:
            return _claimed(claimed, tail, events)
    return None


def _claimed(
    claimed: tuple[Lease, AgentRun], tail: _claim.Tail, events: list[EventSpec]
) -> Claimed:
    """The claim's result; a run that had no events before it has exactly the claim's."""
    lease, run = claimed
    known = None
    if tail.sequence == 0:
        known = [
            AgentRunEvent(
                run_id=run.pk,
                sequence=sequence,
                kind=str(spec.kind),
                payload=ledger.canonical_payload(spec.payload),
            )
            for sequence, spec in enumerate(events)
        ]
    return Claimed(lease, run, known)


@state_write
def run_heartbeat(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
    cost: Decimal | None = None,
) -> bool:
    """Renew the lease (a step boundary may also save ``loop_state``, the run's ``cost`` so far
    and append events).

    Guard: ``running``, ``claimed_by`` = owner, ``lease_epoch`` = epoch. ``False``: lease lost.
    """
    return segment_write(
        lease,
        {"lease_expires": DbValue.LEASE_DEADLINE, **_cost(cost)},
        events,
        loop_state=loop_state,
    )


def _cost(cost: Decimal | None) -> dict[str, Decimal]:
    """The run's cost so far, written with the events that record the answers it adds up."""
    return {} if cost is None else {"cost": cost}


@state_write
def run_stamp_fence(
    lease: Lease,
    *,
    effect: str,
    call: Mapping[str, Any],
    loop_state: Mapping[str, Any] | None = None,
) -> bool:
    """Stamp the write in flight (its effect and call) before the tool runs; renews the lease.

    ``False``: lease lost — the write must not start.
    """
    return segment_write(
        lease,
        {
            "pending_effect": effect,
            "pending_call": dict(call),
            "lease_expires": DbValue.LEASE_DEADLINE,
        },
        loop_state=loop_state,
    )


@state_write
def run_clear_fence(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
    cost: Decimal | None = None,
    in_doubt_unless_committed: bool = False,
) -> bool:
    """Clear the fence after the tool ran (a heartbeat too). ``False``: lease lost.

    ``in_doubt_unless_committed`` (the fence of a non-idempotent write): the write commits only
    on the segment's own ``COMMIT`` (``segment_write``'s ``await_commit``), so a segment that
    dies while its boundary waits leaves the write in doubt for reconciliation (§9.1) rather
    than landing after it died.
    """
    return segment_write(
        lease,
        {
            "pending_effect": "",
            "pending_call": None,
            "lease_expires": DbValue.LEASE_DEADLINE,
            **_cost(cost),
        },
        events,
        loop_state=loop_state,
        await_commit=in_doubt_unless_committed,
    )


@state_write
def run_suspend(
    lease: Lease,
    *,
    status: str,
    pending_turn: PendingTurn,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    written: list[AgentRun] | None = None,
    deadline: WaitDeadline | None = None,
    cost: Decimal | None = None,
) -> bool:
    """Park a running run in a ``waiting_for_*`` state with its pending turn; release the claim.

    ``deadline`` (§5.11): when the wait ends, by the database clock (``Now() + timeout``), and
    what happens then, written by the same ``UPDATE`` — the run never waits without the deadline
    its configuration gave it; none (or no timeout) clears an earlier wait's. An earlier wait's
    escalation is cleared either way.

    ``False``: the run was cancelled or the lease lost meanwhile — fail closed, never announce a
    resumable pause. ``written``: see ``segment_write`` (the parked row, without a read back).
    """
    if status not in {Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT}:
        raise ValueError(f"cannot suspend into {status!r}")
    # A new wait is nobody's escalation yet (``transitions.escalation``).
    waits: dict[str, Any] = {
        "approval_deadline": None,
        "approval_timeout_action": "",
        "escalated_at": None,
        "escalated_to": None,
    }
    if deadline is not None and deadline.timeout is not None:
        waits.update(
            approval_deadline=Later(deadline.timeout), approval_timeout_action=deadline.action
        )
    return segment_write(
        lease,
        {
            "status": status,
            "pending_turn": pending_turn.to_json(),
            "claimed_by": "",
            "lease_expires": None,
            **waits,
            **_cost(cost),
        },
        events,
        loop_state=loop_state,
        written=written,
    )


@state_write
def run_park_in_doubt(
    lease: Lease,
    *,
    pending_turn: PendingTurn,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Park a running run whose non-idempotent write has an unknown outcome in
    ``waiting_for_reconciliation``, as the reaper parks one whose segment died mid-write.

    Guard: owner (the segment holding the lease stamped the fence; nobody else can change it).
    The fence is kept: ``pending_effect`` and ``pending_call`` name the call for the reconciler.
    Claim and lease released. ``False``: the run was cancelled or the lease lost meanwhile —
    announce nothing.
    """
    if pending_turn.kind != "reconciliation":
        raise ValueError("only a reconciliation turn parks a run in doubt")
    return segment_write(
        lease,
        {
            "status": Status.WAITING_FOR_RECONCILIATION,
            "pending_turn": pending_turn.to_json(),
            "claimed_by": "",
            "lease_expires": None,
        },
        events,
        loop_state=loop_state,
    )


@state_write
def run_requeue(
    lease: Lease,
    *,
    error: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Hand a failed running run back to the queue for a retry: ``queued``, budget + 1.

    Guard: owner. Claim and fence cleared. ``False``: lease lost.
    """
    return segment_write(
        lease,
        {
            "status": Status.QUEUED,
            "requeue_count": DbValue.INCREMENT,
            "claimed_by": "",
            "lease_expires": None,
            "pending_effect": "",
            "pending_call": None,
            "error": dict(error),
        },
        events,
    )


@state_write
def run_hand_back(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    cost: Decimal | None = None,
) -> bool:
    """Hand a running run back to the queue because its worker is stopping (docs/design.md
    §3.8): ``queued``, claim, lease and fence cleared, ``loop_state`` saved, ``events``
    appended; the budget (``requeue_count``) is untouched — nothing failed.

    Written at a safe point only: between steps, where a fence still stamped belongs to a write
    that finished and whose ``tool`` event is among ``events`` (its deferred clear), never while
    a write is in flight. Guard: owner. ``False``: the lease is lost (or the run cancelled).
    """
    return segment_write(
        lease,
        {
            "status": Status.QUEUED,
            "claimed_by": "",
            "lease_expires": None,
            "pending_effect": "",
            "pending_call": None,
            **_cost(cost),
        },
        events,
        loop_state=loop_state,
    )


@state_write
def run_notice_cancel(
    lease: Lease, *, events: Iterable[EventSpec] = (), cost: Decimal | None = None
) -> bool:
    """Record that the segment holding the run saw its cancel at a step boundary.

    Guard: ``cancelled`` and still naming this owner and epoch (a cancel keeps the claim so the
    holder can recognise it). Releases the claim; the terminal outcome is untouched.
    """
    return guarded_write(
        lease.run_id,
        Q(status=Status.CANCELLED, claimed_by=lease.owner, lease_epoch=lease.epoch),
        {"claimed_by": "", **_cost(cost)},
        events,
        segment=lease.owner,
        epoch=lease.epoch,
    )
