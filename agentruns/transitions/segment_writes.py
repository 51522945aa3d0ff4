"""A segment's own transitions: births, claims, the heartbeat, the fence, suspending and handing
back to the queue. Each is owner-guarded; ``False`` means the lease is lost."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from agentruns import ledger, tracing
from agentruns.leases import Claimed, EventSpec, Lease
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    Status,
)
from agentruns.transitions import _claim
from agentruns.transitions._writer import (
    RUN_FIELDS,
    append_events,
    event_rows,
    guarded_write,
    lease_seconds,
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
    external_framework: str = "",
    external_state: Any = None,
) -> Lease:
    """Insert a ``running`` run claimed at birth by ``identity`` with epoch 1; with
    ``external_framework``, a run that agent loop drives (its ``external_state`` saved with it,
    its name in the birth event: docs/external.md)."""
    run_uuid = uuid.uuid4()
    born = [birth_event()]
    if external_framework:
        born[0].payload["framework"] = external_framework
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
            lease_expires=ExpressionWrapper(
                Now() + Value(timedelta(seconds=lease_seconds())), output_field=DateTimeField()
            ),
            lease_epoch=1,
            started_at=Now(),
            external_framework=external_framework,
            external_state=external_state,
            **{ledger.HEAD_FIELD: head, ledger.SEQUENCE_FIELD: len(born)},
            **_traced(run_uuid, configuration, initiator_id, "sync", prompt),
        )
        append_events({**row, "run": run.pk} for row in event_rows(0, (identity, 1), born, links))
    return Lease(run.pk, run_uuid, identity, 1, next_sequence=len(born), head=head)


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
        **_traced(run_uuid, configuration, initiator_id, "queued", prompt),
    )


def _traced(
    run_uuid: UUID,
    configuration: AgentConfiguration,
    initiator_id: int | None,
    mode: str,
    prompt: str,
) -> dict[str, str]:
    """The trace fields of a run being inserted: its run span's ids (``tracing.run_born``), or
    nothing when spans are not recorded."""
    return tracing.run_born(
        run_uuid=run_uuid,
        configuration=configuration.slug,
        initiator_id=initiator_id,
        mode=mode,
        prompt=prompt,
    )


# --- Claims, heartbeat, fence --------------------------------------------------------------------


#: How often a claim reads the run again when its guard matched a queued run that changed
#: between the read and the claim (a reaper's redispatch appends an event to a queued run).
CLAIM_ATTEMPTS = 3


@state_write
def run_claim_queued_row(
    *,
    identity: str,
    run_id: int | None = None,
    run_uuid: UUID | str | None = None,
    external_framework: str = "",
) -> Claimed | None:
    """Claim a ``queued`` run, named by ``run_id`` or ``run_uuid``: ``running``, a lease for
    ``identity`` until the database clock plus ``LEASE_SECONDS``, epoch + 1, and a ``lease``
    event. Returns the lease with the row as the claim left it and its configuration (and, on a
    run's first claim, its events: the claim's own), so the segment reads none of them again.

    A compare-and-set on ``(status, lease_epoch, next_sequence, ledger_head)`` in one guarded
    write (the statement ``claim``): of any number of concurrent claimers exactly one matches. A
    run named by uuid is first tried as never claimed (no read); otherwise, or when that matches
    nothing, the row is read and the guard tried with what it holds. ``None`` means another
    worker won, the run is no longer queued (cancelled, already running, terminal) or there is
    no such run: do nothing.

    ``external_framework``: claim only a run that agent loop drives ("", the default: only a run
    Leasehold's own loop drives — a worker never takes an external run, docs/external.md); its
    ``lease`` event is ``claimed_by_loop`` naming the framework.
    """
    if (run_id is None) == (run_uuid is None):
        raise ValueError("name the run by run_id or by run_uuid")
    action: dict[str, Any] = {"action": "claimed"}
    if external_framework:
        action = {"action": "claimed_by_loop", "framework": external_framework}
    events = [EventSpec(EventKind.LEASE, action)]
    external = {"external_framework": external_framework}
    if run_uuid is not None:
        try:
            named = RUN_FIELDS["uuid"].to_python(run_uuid)
        except ValidationError:  # not a uuid: there is no such run
            return None
        if named is None:
            return None
        tail = _claim.Tail.unclaimed(named)
        claimed = _claim.claim(
            run_uuid=named, tail=tail, identity=identity, events=events, **external
        )
        if claimed is not None:
            return _claimed(claimed, tail, events)
        where = Q(uuid=named)
    else:
        where = Q(pk=run_id)
    fields = (
        "uuid",
        "status",
        "lease_epoch",
        ledger.SEQUENCE_FIELD,
        ledger.HEAD_FIELD,
        "external_framework",
    )
    for _ in range(CLAIM_ATTEMPTS):
        try:
            row = AgentRun.objects.filter(where).values(*fields).first()
        except (ValidationError, ValueError):  # not an id: there is no such run
            return None
        if row is None or row["status"] != Status.QUEUED:
            return None
        if row["external_framework"] != external_framework:
            return None
        tail = _claim.Tail(
            row["lease_epoch"], row[ledger.SEQUENCE_FIELD], row[ledger.HEAD_FIELD], row["uuid"]
        )
        claimed = _claim.claim(
            run_uuid=row["uuid"], tail=tail, identity=identity, events=events, **external
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
    and append events): the statement ``heartbeat``.

    Guard: ``running``, ``claimed_by`` = owner, ``lease_epoch`` = epoch. ``False``: lease lost.
    """
    params = {"lease_seconds": lease_seconds(), "loop_state": _dict(loop_state), "cost": cost}
    return segment_write(lease, "heartbeat", params, events) is not None


def _dict(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A JSON column's value given as a mapping (``None``: not given, the column kept)."""
    return None if value is None else dict(value)


@state_write
def run_stamp_fence(
    lease: Lease,
    *,
    effect: str,
    call: Mapping[str, Any],
    loop_state: Mapping[str, Any] | None = None,
) -> bool:
    """Stamp the write in flight (its effect and call) before the tool runs; renews the lease
    (the statement ``stamp_fence``).

    ``False``: lease lost — the write must not start.
    """
    params = {
        "pending_effect": str(effect),
        "pending_call": dict(call),
        "lease_seconds": lease_seconds(),
        "loop_state": _dict(loop_state),
    }
    return segment_write(lease, "stamp_fence", params) is not None


@state_write
def run_clear_fence(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
    cost: Decimal | None = None,
    in_doubt_unless_committed: bool = False,
) -> bool:
    """Clear the fence after the tool ran (a heartbeat too; the statement ``clear_fence``).
    ``False``: lease lost.

    ``in_doubt_unless_committed`` (the fence of a non-idempotent write): the write commits only
    on the segment's own ``COMMIT`` (``segment_write``'s ``await_commit``), so a segment that
    dies while its boundary waits leaves the write in doubt for reconciliation (§9.1) rather
    than landing after it died.
    """
    params = {"lease_seconds": lease_seconds(), "loop_state": _dict(loop_state), "cost": cost}
    written = segment_write(
        lease, "clear_fence", params, events, await_commit=in_doubt_unless_committed
    )
    return written is not None


@state_write
def run_suspend(
    lease: Lease,
    *,
    status: str,
    pending_turn: PendingTurn,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    deadline: WaitDeadline | None = None,
    cost: Decimal | None = None,
) -> AgentRun | None:
    """Park a running run in a ``waiting_for_*`` state with its pending turn; release the claim
    (the statement ``suspend``). Returns the parked row as the write returned it (no read back).

    ``deadline`` (§5.11): when the wait ends, by the database clock (``Now() + timeout``), and
    what happens then, written by the same ``UPDATE`` — the run never waits without the deadline
    its configuration gave it; none (or no timeout) clears an earlier wait's. An earlier wait's
    escalation is cleared either way.

    ``None``: the run was cancelled or the lease lost meanwhile — fail closed, never announce a
    resumable pause.
    """
    if status not in {Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT}:
        raise ValueError(f"cannot suspend into {status!r}")
    timeout = deadline.timeout if deadline is not None else None
    params = {
        "status": str(status),
        "pending_turn": pending_turn.to_json(),
        "wait_seconds": None if timeout is None else timeout.total_seconds(),
        "approval_timeout_action": "" if deadline is None or timeout is None else deadline.action,
        "loop_state": dict(loop_state),
        "cost": cost,
    }
    return segment_write(lease, "suspend", params, events)


@state_write
def run_park_in_doubt(
    lease: Lease,
    *,
    pending_turn: PendingTurn,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Park a running run whose non-idempotent write has an unknown outcome in
    ``waiting_for_reconciliation``, as the reaper parks one whose segment died mid-write (the
    statement ``park_in_doubt``).

    Guard: owner (the segment holding the lease stamped the fence; nobody else can change it).
    The fence is kept: ``pending_effect`` and ``pending_call`` name the call for the reconciler.
    Claim and lease released. ``False``: the run was cancelled or the lease lost meanwhile —
    announce nothing.
    """
    if pending_turn.kind != "reconciliation":
        raise ValueError("only a reconciliation turn parks a run in doubt")
    params = {"pending_turn": pending_turn.to_json(), "loop_state": dict(loop_state)}
    return segment_write(lease, "park_in_doubt", params, events) is not None


@state_write
def run_requeue(
    lease: Lease,
    *,
    error: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Hand a failed running run back to the queue for a retry: ``queued``, budget + 1 (the
    statement ``requeue``).

    Guard: owner. Claim and fence cleared. ``False``: lease lost.
    """
    return segment_write(lease, "requeue", {"error": dict(error)}, events) is not None


@state_write
def run_hand_back(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    cost: Decimal | None = None,
) -> bool:
    """Hand a running run back to the queue because its worker is stopping (docs/design.md
    §3.8; the statement ``hand_back``): ``queued``, claim, lease and fence cleared,
    ``loop_state`` saved, ``events`` appended; the budget (``requeue_count``) is untouched —
    nothing failed.

    Written at a safe point only: between steps, where a fence still stamped belongs to a write
    that finished and whose ``tool`` event is among ``events`` (its deferred clear), never while
    a write is in flight. Guard: owner. ``False``: the lease is lost (or the run cancelled).
    """
    params = {"loop_state": dict(loop_state), "cost": cost}
    return segment_write(lease, "hand_back", params, events) is not None


@state_write
def run_notice_cancel(
    lease: Lease, *, events: Iterable[EventSpec] = (), cost: Decimal | None = None
) -> bool:
    """Record that the segment holding the run saw its cancel at a step boundary (the statement
    ``notice_cancel``).

    Guard: ``cancelled`` and still naming this owner and epoch (a cancel keeps the claim so the
    holder can recognise it). Releases the claim; the terminal outcome is untouched.
    """
    params = {"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch, "cost": cost}
    written = guarded_write("notice_cancel", params, events, segment=lease.owner, epoch=lease.epoch)
    return written is not None
