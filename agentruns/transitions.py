"""Every guarded write on a run's status, lease and fence columns (RUNS.md §3.2).

Each state change is one filtered ``UPDATE`` whose ``WHERE`` is the guard and whose row count is
the verdict, or — for a decision that must read, check and claim — one transaction holding the
row lock (``select_for_update``; on SQLite the IMMEDIATE transaction serialises writers instead).
Nothing else in the code base writes these columns.

Conventions:

* Lease arithmetic and comparisons use the database clock (``Now()``), never the app server's.
* "Owner" means ``claimed_by`` **and** ``lease_epoch``: a zombie holding an older epoch of the
  same identity matches nothing.
* Segment writes return ``bool``: ``False`` means the lease is lost (or the run was cancelled)
  and the caller must stop at once — settle nothing, write no event, start no write.
* Decisions raise a typed refusal (``StaleTurn``, ``AlreadyDecided``, ``NotWaiting``, …) and
  change nothing when refused.
* A database error never escapes as a bare ``DatabaseError``: it becomes ``StateWriteFailed``
  after the transaction rolled back.
* Events written with a state change are inserted in the same transaction, after the guarded
  ``UPDATE`` took the row, so an event exists if and only if its change took effect.
* Each transition is its guard and its values, handed to one of two writers: ``_segment_write``
  (a segment's own writes under its lease: the step boundary, in precompiled SQL) or
  ``_guarded_write`` (any other guard, through the ORM). Both add ``updated_at`` and take
  database-computed values as ``DbValue`` (the clock, the lease deadline, an increment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Now

from agentruns._writer import (
    _RUN_FIELDS,
    DbValue,
    _guarded_write,
    _insert_events,
    _segment_write,
    _state_write,
    lease_deadline,
)
from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    UnreadableState,
)
from agentruns.leases import Decided, EventSpec, Lease
from agentruns.models import (
    TERMINAL_STATUSES,
    AgentConfiguration,
    AgentRun,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.turns import (
    Decision,
    PendingTurn,
    decided_digests,
    read_pending_turn,
    stored_digest,
    with_decision,
)

NON_TERMINAL = [s for s in Status.values if s not in TERMINAL_STATUSES]


# --- Births ------------------------------------------------------------------------------------


@_state_write
def run_start(
    *,
    configuration: AgentConfiguration,
    initiator_id: int | None,
    prompt: str,
    request: Mapping[str, Any],
    identity: str,
) -> Lease:
    """Insert a ``running`` run claimed at birth by ``identity`` with epoch 1."""
    with transaction.atomic():
        run = AgentRun.objects.create(
            configuration=configuration,
            initiator_id=initiator_id,
            prompt=prompt,
            request=dict(request),
            status=Status.RUNNING,
            claimed_by=identity,
            lease_expires=lease_deadline(),
            lease_epoch=1,
            started_at=Now(),
        )
        lease = Lease(run.pk, run.uuid, identity, 1, next_sequence=0)
        lease.next_sequence = _insert_events(
            run.pk, 0, identity, 1, [EventSpec(EventKind.LEASE, {"action": "claimed_at_birth"})]
        )
    return lease


@_state_write
def run_enqueue(
    *,
    configuration: AgentConfiguration,
    initiator_id: int | None,
    prompt: str,
    request: Mapping[str, Any],
) -> AgentRun:
    """Insert a ``queued`` run with no claim. The caller sends the wake-up after commit."""
    return AgentRun.objects.create(
        configuration=configuration,
        initiator_id=initiator_id,
        prompt=prompt,
        request=dict(request),
        status=Status.QUEUED,
    )


# --- Claims, heartbeat, fence --------------------------------------------------------------------


@_state_write
def run_claim_queued(*, run_id: int, identity: str) -> Lease | None:
    """Claim a ``queued`` run: ``running``, a lease for ``identity``, epoch + 1.

    A compare-and-set on ``(status, lease_epoch)``: of any number of concurrent claimers exactly
    one matches. ``None`` means another worker won or the run is no longer queued (cancelled,
    already running, terminal): do nothing.
    """
    row = AgentRun.objects.filter(pk=run_id).values("status", "lease_epoch", "uuid").first()
    if row is None or row["status"] != Status.QUEUED:
        return None
    lease = Lease(run_id, row["uuid"], identity, row["lease_epoch"] + 1, next_sequence=0)
    claimed = _guarded_write(
        run_id,
        Q(status=Status.QUEUED, lease_epoch=row["lease_epoch"]),
        {
            "status": Status.RUNNING,
            "claimed_by": identity,
            "lease_expires": DbValue.LEASE_DEADLINE,
            "lease_epoch": lease.epoch,
            "started_at": Coalesce(F("started_at"), Now()),
        },
        [EventSpec(EventKind.LEASE, {"action": "claimed"})],
        lease=lease,
    )
    return lease if claimed else None


@_state_write
def run_heartbeat(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
) -> bool:
    """Renew the lease (a step boundary may also save ``loop_state`` and append events).

    Guard: ``running``, ``claimed_by`` = owner, ``lease_epoch`` = epoch. ``False``: lease lost.
    """
    return _segment_write(
        lease, {"lease_expires": DbValue.LEASE_DEADLINE}, events, loop_state=loop_state
    )


@_state_write
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
    return _segment_write(
        lease,
        {
            "pending_effect": effect,
            "pending_call": dict(call),
            "lease_expires": DbValue.LEASE_DEADLINE,
        },
        loop_state=loop_state,
    )


@_state_write
def run_clear_fence(
    lease: Lease,
    *,
    loop_state: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
) -> bool:
    """Clear the fence after the tool ran (a heartbeat too). ``False``: lease lost."""
    return _segment_write(
        lease,
        {"pending_effect": "", "pending_call": None, "lease_expires": DbValue.LEASE_DEADLINE},
        events,
        loop_state=loop_state,
    )


@_state_write
def run_suspend(
    lease: Lease,
    *,
    status: str,
    pending_turn: PendingTurn,
    loop_state: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Park a running run in a ``waiting_for_*`` state with its pending turn; release the claim.

    ``False``: the run was cancelled or the lease lost meanwhile — fail closed, never announce a
    resumable pause.
    """
    if status not in {Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT}:
        raise ValueError(f"cannot suspend into {status!r}")
    return _segment_write(
        lease,
        {
            "status": status,
            "pending_turn": pending_turn.to_json(),
            "claimed_by": "",
            "lease_expires": None,
        },
        events,
        loop_state=loop_state,
    )


@_state_write
def run_requeue(
    lease: Lease,
    *,
    error: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
) -> bool:
    """Hand a failed running run back to the queue for a retry: ``queued``, budget + 1.

    Guard: owner. Claim and fence cleared. ``False``: lease lost.
    """
    return _segment_write(
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


@_state_write
def run_notice_cancel(lease: Lease, *, events: Iterable[EventSpec] = ()) -> bool:
    """Record that the segment holding the run saw its cancel at a step boundary.

    Guard: ``cancelled`` and still naming this owner and epoch (a cancel keeps the claim so the
    holder can recognise it). Releases the claim; the terminal outcome is untouched.
    """
    return _guarded_write(
        lease.run_id,
        Q(status=Status.CANCELLED, claimed_by=lease.owner, lease_epoch=lease.epoch),
        {"claimed_by": ""},
        events,
        segment=lease.owner,
        epoch=lease.epoch,
    )


# --- Decisions (read, check and claim under the row lock) ----------------------------------------


def _lock_run(run_uuid: UUID | str) -> AgentRun:
    try:
        return AgentRun.objects.select_for_update().get(uuid=run_uuid)
    except (AgentRun.DoesNotExist, ValidationError, ValueError) as exc:
        raise RunNotFound() from exc


def _show_written(run: AgentRun, values: Mapping[str, Any]) -> None:
    """Make ``run`` show what an ``UPDATE`` of ``values`` wrote without reading the row back:
    plain values are set; values the database computed (expressions: the clock) are deferred,
    so Django loads them on first access and a stale one is never seen."""
    for name, value in values.items():
        attname = _RUN_FIELDS[name].attname
        if isinstance(value, DbValue) or hasattr(value, "resolve_expression"):
            run.__dict__.pop(attname, None)
        else:
            setattr(run, attname, value)


def _check_turn(run: AgentRun, *, expected_status: str, turn_digest: str | None) -> None:
    """Refuse unless the run waits in ``expected_status`` on exactly the turn ``turn_digest`` and
    that turn reads as ``turns.read_pending_turn`` shows it (``UnreadableState`` otherwise)."""
    current = stored_digest(run.pending_turn)
    if run.status == expected_status and turn_digest and current == turn_digest:
        pending = read_pending_turn(run)
        if not pending.readable:  # fail closed: never decide what nobody could be shown
            raise UnreadableState(f"its pending turn cannot be read: {pending.problem}")
        return
    if turn_digest and turn_digest in decided_digests(run.loop_state):
        raise AlreadyDecided()
    if run.status != expected_status:
        raise NotWaiting(status=run.status)
    raise StaleTurn()


@_state_write
def run_decide(
    *,
    run_uuid: UUID | str,
    expected_status: str,
    turn_digest: str | None,
    decision: Decision,
    event: EventSpec | Callable[[AgentRun], EventSpec],
    identity: str | None,
    check: Callable[[AgentRun], None] | None = None,
) -> Decided:
    """Record a human decision on a waiting run and hand it on, in one locked transaction.

    Guard (under the row lock): ``status == expected_status`` and the pending turn's digest equals
    ``turn_digest``; then ``check(run)`` (e.g. four-eyes) may refuse. With ``identity`` the run
    continues inline: ``running``, claimed by ``identity`` (a ``resume:`` segment), epoch + 1.
    Without, it is ``queued`` for a worker. ``decision`` is recorded in the loop state
    (``turns.with_decision``) and ``event`` is appended in the same transaction: audited if and
    only if it took effect. ``event`` may be a function of the locked run (to name what was
    decided, e.g. the pending calls, from the row the guard checked).

    The returned run is not read back: it shows the values written, and the columns the
    database computed (``lease_expires``, ``updated_at``) are deferred — loaded on first access.

    Raises ``RunNotFound``, ``StaleTurn``, ``AlreadyDecided``, ``NotWaiting`` or what ``check``
    raises; nothing changes then.
    """
    with transaction.atomic():
        run = _lock_run(run_uuid)
        _check_turn(run, expected_status=expected_status, turn_digest=turn_digest)
        if check is not None:
            check(run)
        state = with_decision(run.loop_state, decision=decision, turn_digest=turn_digest)
        values: dict[str, Any] = {
            "loop_state": state,
            "pending_turn": None,
            # A reconciliation verdict resolves the in-doubt write: the fence has done its job.
            "pending_effect": "",
            "pending_call": None,
        }
        lease = None
        if identity:
            lease = Lease(run.pk, run.uuid, identity, run.lease_epoch + 1, next_sequence=0)
            values.update(
                status=Status.RUNNING,
                claimed_by=identity,
                lease_expires=DbValue.LEASE_DEADLINE,
                lease_epoch=lease.epoch,
            )
        else:
            values.update(status=Status.QUEUED)
        if not _guarded_write(
            run.pk,
            Q(status=expected_status),
            values,
            [event(run) if callable(event) else event],
            epoch=run.lease_epoch,
            lease=lease,
            savepoint=False,
        ):  # pragma: no cover - impossible under the row lock
            raise NotWaiting()
        _show_written(run, {**values, "updated_at": DbValue.NOW})
    return Decided(run=run, lease=lease)


@_state_write
def run_reconcile_abandon(
    *,
    run_uuid: UUID | str,
    turn_digest: str | None,
    event: EventSpec,
    check: Callable[[AgentRun], None] | None = None,
) -> AgentRun:
    """Settle an in-doubt run ``failed`` / ``reconciled_abandoned`` under the row lock.

    Guard: ``waiting_for_reconciliation`` and the digest of the in-doubt call. Raises as
    ``run_decide``.
    """
    with transaction.atomic():
        run = _lock_run(run_uuid)
        _check_turn(run, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=turn_digest)
        if check is not None:
            check(run)
        state = with_decision(run.loop_state, decision=None, turn_digest=turn_digest)
        if not _guarded_write(
            run.pk,
            Q(status=Status.WAITING_FOR_RECONCILIATION),
            {
                "status": Status.FAILED,
                "termination_reason": TerminationReason.RECONCILED_ABANDONED,
                "loop_state": state,
                "pending_turn": None,
                "claimed_by": "",
                "lease_expires": None,
                "pending_effect": "",
                "pending_call": None,
                "finished_at": DbValue.NOW,
            },
            [event],
            epoch=run.lease_epoch,
            savepoint=False,
        ):  # pragma: no cover - impossible under the row lock
            raise NotWaiting()
        run.refresh_from_db()
    return run


# --- The reaper's transitions (called inside its locked batch) -----------------------------------


def _stale() -> Q:
    return Q(status=Status.RUNNING, lease_expires__lt=Now())


@_state_write
def run_reclaim_stale(*, run_id: int, segment: str, event: EventSpec) -> bool:
    """Take a stale run back to ``queued`` for a worker: budget + 1, claim and fence cleared.

    Guard: ``running`` and ``lease_expires < Now()``, re-checked in the UPDATE itself. ``False``:
    the holder renewed meanwhile — skip it.
    """
    return _guarded_write(
        run_id,
        _stale(),
        {
            "status": Status.QUEUED,
            "requeue_count": DbValue.INCREMENT,
            "claimed_by": "",
            "lease_expires": None,
            "pending_effect": "",
            "pending_call": None,
        },
        [event],
        segment=segment,
    )


@_state_write
def run_mark_in_doubt(
    *, run_id: int, pending_turn: PendingTurn, segment: str, event: EventSpec
) -> bool:
    """Park a stale run caught mid non-idempotent write in ``waiting_for_reconciliation``.

    Guard: ``running``, ``lease_expires < Now()`` and fence ``non_idempotent_write``. Claim and
    lease cleared; ``pending_effect``/``pending_call`` kept for the reconciler. ``False``: skip.
    """
    return _guarded_write(
        run_id,
        _stale() & Q(pending_effect=Effect.NON_IDEMPOTENT_WRITE),
        {
            "status": Status.WAITING_FOR_RECONCILIATION,
            "claimed_by": "",
            "lease_expires": None,
            "pending_turn": pending_turn.to_json(),
        },
        [event],
        segment=segment,
    )


@_state_write
def run_settle_undispatched(
    *, run_id: int, lease_epoch: int, error: Mapping[str, Any], segment: str, event: EventSpec
) -> bool:
    """Settle a run the reaper reclaimed but whose wake-up could not be sent: ``failed`` /
    ``not_retryable``, never left ``queued`` with nothing to wake it (RUNS.md §7, rule 4).

    Guard: ``queued``, unclaimed and still at ``lease_epoch`` (the epoch the reclaim left), so a
    worker that claimed it meanwhile (a stale or duplicate task) keeps it. ``False``: skip.
    """
    return _guarded_write(
        run_id,
        Q(status=Status.QUEUED, claimed_by="", lease_epoch=lease_epoch),
        {
            "status": Status.FAILED,
            "termination_reason": TerminationReason.NOT_RETRYABLE,
            "error": dict(error),
            "pending_turn": None,
            "finished_at": DbValue.NOW,
        },
        [event],
        segment=segment,
    )


@_state_write
def run_mark_redispatched(
    *, run_id: int, older_than_seconds: float, segment: str, event: EventSpec
) -> bool:
    """Note that the reaper is about to send a fresh wake-up to a queued run nobody claimed.

    Guard: ``queued``, unclaimed and ``updated_at`` older than ``older_than_seconds`` on the
    database clock (re-checked here, so of two reapers only one redispatches). Bumps
    ``updated_at`` (the next redispatch waits a whole period) and appends ``event``. ``False``:
    claimed, touched, cancelled or settled meanwhile — send nothing.
    """
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=older_than_seconds)), output_field=DateTimeField()
    )
    return _guarded_write(
        run_id,
        Q(status=Status.QUEUED, claimed_by="", updated_at__lt=cutoff),
        {},
        [event],
        segment=segment,
    )


# --- Endings -------------------------------------------------------------------------------------


@_state_write
def run_settle(
    *,
    run_id: int,
    status: str,
    reason: str,
    lease: Lease | None = None,
    stale_only: bool = False,
    output: str = "",
    error: Mapping[str, Any] | None = None,
    totals: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
    segment: str = "",
) -> bool:
    """Move a run to a terminal status with its reason, output and totals.

    Guard: status non-terminal; with ``lease``, also owner (a segment's own settle); with
    ``stale_only``, also ``running`` and ``lease_expires < Now()`` (the reaper). Claim, lease and
    fence are cleared. ``False``: already terminal or no longer ours — the first outcome stands.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status!r} is not terminal")
    values: dict[str, Any] = {
        "status": status,
        "termination_reason": reason,
        "output": output,
        "error": dict(error or {}),
        "claimed_by": "",
        "lease_expires": None,
        "pending_effect": "",
        "pending_call": None,
        "pending_turn": None,
        "finished_at": DbValue.NOW,
        **dict(totals or {}),
    }
    if lease is not None:
        return _segment_write(lease, values, events)
    guard = _stale() if stale_only else Q(status__in=NON_TERMINAL)
    return _guarded_write(run_id, guard, values, events, segment=segment)


@_state_write
def run_cancel(*, run_id: int, actor_id: int | None = None, note: str = "") -> bool:
    """Cancel a non-terminal run. ``False``: already terminal — nothing changes.

    A running holder keeps its ``claimed_by``/``lease_epoch`` so that it recognises the cancel at
    its next boundary (``run_notice_cancel``); the lease itself ends now.
    """
    return _guarded_write(
        run_id,
        Q(status__in=NON_TERMINAL),
        {
            "status": Status.CANCELLED,
            "termination_reason": TerminationReason.CANCELLED,
            "lease_expires": None,
            "pending_turn": None,
            "finished_at": DbValue.NOW,
        },
        [EventSpec(EventKind.CANCEL, {"note": note}, actor_id=actor_id)],
    )


@_state_write
def run_abandon(lease: Lease, *, note: str = "") -> bool:
    """Settle a run whose interactive client went away mid-stream: ``failed`` / ``abandoned``.

    Guard: owner (``running``, ``claimed_by`` and ``lease_epoch`` of ``lease``) and no fence: a
    write in flight is never cut off from its audit event, so a fenced run is refused and the
    caller retries at the segment's next boundary. Claim and lease are cleared, so the segment
    still executing under ``lease`` finds its next boundary write matching nothing (lease lost)
    and stops. May be called from another thread than the segment's: the ``lease`` event is
    sequenced from the table, not from the segment's counter. ``False``: fenced, already paused
    or ended, or the lease was lost — nothing changed.
    """
    return _guarded_write(
        lease.run_id,
        Q(
            status=Status.RUNNING,
            claimed_by=lease.owner,
            lease_epoch=lease.epoch,
            pending_effect="",
        ),
        {
            "status": Status.FAILED,
            "termination_reason": TerminationReason.ABANDONED,
            "error": {"type": "Abandoned", "message": "the client went away mid-stream"},
            "claimed_by": "",
            "lease_expires": None,
            "pending_turn": None,
            "finished_at": DbValue.NOW,
        },
        [EventSpec(EventKind.LEASE, {"action": "abandoned", "note": note})],
        segment=lease.owner,
        epoch=lease.epoch,
    )
