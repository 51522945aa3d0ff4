"""Decisions: lock the waiting run, let the caller check it, record the decision — in one
transaction, in that order (``locked_waiting_run``, then ``record_decision`` or
``record_abandon``). The checks are the caller's plain code between the two: nothing here calls
back up."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction

from agentruns import ledger
from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    StateWriteFailed,
    UnreadableState,
)
from agentruns.leases import Decided, EventSpec, Lease
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    Status,
)
from agentruns.tools.gate import ToolGate
from agentruns.tools.shown import executing_digest, shown_turn
from agentruns.transitions._writer import (
    execute,
    known_events,
    lease_seconds,
    locked_write,
    show,
    written_row,
)
from agentruns.turns import (
    Decision,
    decided_digests,
    read_pending_turn,
    stored_digest,
    with_decision,
)
from agentruns.versions import UnreadableVersion, pin

# --- Decisions (read, check and claim under the row lock) ----------------------------------------


def _lock_run(run_uuid: UUID | str) -> AgentRun:
    """The run, locked, with its configuration and approver group read in the same statement
    (not locked: ``FOR UPDATE OF`` the run only; the statement ``lock_waiting_run``). A
    decision's checks read the configuration from here, and an inline continuation gets the row
    as it stands (no second read). Its configuration is the version the run pinned
    (``versions.pin``)."""
    try:
        names, rows = execute("lock_waiting_run", {"uuid": run_uuid})
    except (ValidationError, ValueError) as exc:  # not a uuid: there is no such run
        raise RunNotFound() from exc
    if not rows:
        raise RunNotFound()
    *row, group_id, group_name = rows[0]
    run = written_row(names[:-2], row)
    if group_id is not None:
        run.configuration.approver_group = Group.from_db(
            DEFAULT_DB_ALIAS, ["id", "name"], [group_id, group_name]
        )
    try:
        return pin(run)
    except UnreadableVersion as exc:  # fail closed: nobody can say what would run
        raise UnreadableState(f"its configuration version cannot be read: {exc}") from exc


def _check_turn(run: AgentRun, *, expected_status: str, turn_digest: str | None) -> None:
    """Refuse unless the run waits in ``expected_status`` on exactly the turn ``turn_digest``
    digests as a card shows it now (``tools.shown.shown_turn``: the stored calls, their tools
    read from the run's gate) and that is what would run: the digest recomputed from the loop
    state the same way (``tools.shown.executing_digest``) equals it. A stored turn that does not
    read is ``UnreadableState`` (fail closed: never decide what nobody could be shown), as is a
    card that is not what would run; a digest of another turn is ``AlreadyDecided``,
    ``NotWaiting`` or ``StaleTurn``. Reads the registry and the tools' server rows afresh,
    under the row lock."""
    if run.status == expected_status and turn_digest:
        pending = read_pending_turn(run)
        if not pending.readable:
            if stored_digest(run.pending_turn) == turn_digest:
                raise UnreadableState(f"its pending turn cannot be read: {pending.problem}")
        else:
            gate = ToolGate.of(run)
            if shown_turn(run, pending, gate=gate).turn_digest == turn_digest:
                if executing_digest(run, pending, gate=gate) != turn_digest:
                    # What would run is not what was shown: the loop state and the card disagree.
                    raise UnreadableState("the turn that would run is not the turn shown")
                return
    if turn_digest and turn_digest in decided_digests(run.loop_state):
        raise AlreadyDecided()
    if run.status != expected_status:
        raise NotWaiting(status=run.status)
    raise StaleTurn()


@contextmanager
def locked_waiting_run(
    run_uuid: UUID | str, *, expected_status: str, turn_digest: str | None
) -> Iterator[AgentRun]:
    """Open a decision's transaction: lock the run (``SELECT … FOR UPDATE``, its configuration
    and approver group read with it) and refuse unless it waits in ``expected_status`` on the
    turn ``turn_digest`` (``_check_turn``). The caller checks what else the decision needs
    against the yielded row, then records it with ``record_decision`` or ``record_abandon`` —
    all before the block ends, under the lock. Anything raised in the block rolls it back:
    nothing changes. A database error becomes ``StateWriteFailed``.

    Raises ``RunNotFound``, ``StaleTurn``, ``AlreadyDecided``, ``NotWaiting`` or
    ``UnreadableState`` before yielding."""
    try:
        with transaction.atomic():
            run = _lock_run(run_uuid)
            _check_turn(run, expected_status=expected_status, turn_digest=turn_digest)
            yield run
    except DatabaseError as exc:
        raise StateWriteFailed(
            f"a decision: the database refused the write ({type(exc).__name__})",
            transition="record_decision",
        ) from exc


def _under_lock(run: AgentRun) -> None:
    if not transaction.get_connection().in_atomic_block:  # pragma: no cover - a caller's bug
        raise RuntimeError(f"run {run.uuid}: a decision is recorded under locked_waiting_run")


def record_decision(
    run: AgentRun,
    *,
    expected_status: str,
    turn_digest: str | None,
    decision: Decision,
    event: EventSpec,
    identity: str | None,
) -> Decided:
    """Record a human decision on ``run`` — locked and checked by ``locked_waiting_run``, whose
    block this must be called in — and hand it on.

    With ``identity`` the run continues inline: ``running``, claimed by ``identity`` (a
    ``resume:`` segment), epoch + 1. Without, it is ``queued`` for a worker. A run an external
    agent loop drives is always queued, for that loop to claim (docs/external.md). The wait's
    ``approval_deadline`` and ``approval_timeout_action`` are cleared by the same ``UPDATE``.
    ``decision`` is recorded in the loop state (``turns.with_decision``) and ``event`` is
    appended in the same transaction: audited if and only if it took effect.

    The returned run is not read back: it shows the row as the write returned it (the statement
    ``decide_queue`` or ``decide_resume``).
    """
    _under_lock(run)
    if run.external_framework:
        identity = None  # its own agent loop continues it, never Leasehold's (docs/external.md)
    state = with_decision(run.loop_state, decision=decision, turn_digest=turn_digest)
    params: dict[str, Any] = {"status": expected_status, "loop_state": state}
    lease = None
    signer = ("", run.lease_epoch)
    if identity:
        lease = Lease(run.pk, run.uuid, identity, run.lease_epoch + 1, next_sequence=0)
        params.update(owner=identity, epoch=lease.epoch, lease_seconds=lease_seconds())
        signer = (lease.owner, lease.epoch)
    first = run.next_sequence
    row = locked_write(
        run,
        "decide_resume" if identity else "decide_queue",
        params,
        [event],
        signer=signer,
        lease=lease,
    )
    if row is None:  # pragma: no cover - impossible under the row lock
        raise NotWaiting()
    show(run, row)
    return Decided(run=run, lease=lease, event=event, events=_with_own(row, first, event))


def _with_own(row: AgentRun, first: int, event: EventSpec) -> list[AgentRunEvent] | None:
    """The run's events as the decision's statement read them under the row lock (before its
    own, ``known_events``), followed by the decision's event numbered ``first``; ``None`` when
    the statement read none (queued, or SQLite: the continuation reads them)."""
    known = known_events(row)
    if known is None:
        return None
    payload = ledger.canonical_payload(event.payload)
    return [*known, AgentRunEvent(run_id=row.pk, sequence=first, kind=event.kind, payload=payload)]


def record_abandon(run: AgentRun, *, turn_digest: str | None, event: EventSpec) -> AgentRun:
    """Settle the in-doubt ``run`` — locked and checked by ``locked_waiting_run`` (status
    ``waiting_for_reconciliation``), whose block this must be called in — ``failed`` /
    ``reconciled_abandoned``, appending ``event`` (the statement ``reconcile_abandon``). Returns
    the row as the write returned it."""
    _under_lock(run)
    state = with_decision(run.loop_state, decision=None, turn_digest=turn_digest)
    row = locked_write(
        run, "reconcile_abandon", {"loop_state": state}, [event], signer=("", run.lease_epoch)
    )
    if row is None:  # pragma: no cover - impossible under the row lock
        raise NotWaiting()
    show(run, row)
    return run


def run_decide(
    *,
    run_uuid: UUID | str,
    expected_status: str,
    turn_digest: str | None,
    decision: Decision,
    event: EventSpec,
    identity: str | None,
) -> Decided:
    """Record a decision that needs no check beyond its guard (status and digest, under the row
    lock): ``locked_waiting_run`` then ``record_decision``. Raises as ``locked_waiting_run``."""
    with locked_waiting_run(
        run_uuid, expected_status=expected_status, turn_digest=turn_digest
    ) as run:
        return record_decision(
            run,
            expected_status=expected_status,
            turn_digest=turn_digest,
            decision=decision,
            event=event,
            identity=identity,
        )


def run_reconcile_abandon(
    *, run_uuid: UUID | str, turn_digest: str | None, event: EventSpec
) -> AgentRun:
    """Settle an in-doubt run ``failed`` / ``reconciled_abandoned`` under the row lock
    (``locked_waiting_run`` then ``record_abandon``). Raises as ``locked_waiting_run``."""
    with locked_waiting_run(
        run_uuid, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=turn_digest
    ) as run:
        return record_abandon(run, turn_digest=turn_digest, event=event)
