"""A tool's automatic check of an in-doubt write: recording where it stands on the waiting run
(``pending_turn["check"]``). Its verdict, when it has one, goes through ``run_decide`` like a
person's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from uuid import UUID

from django.db import DatabaseError, transaction

from agentruns import tracing
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, Status
from agentruns.transitions._writer import locked_write
from agentruns.transitions.deciding import _lock_run
from agentruns.turns import RECONCILIATION, CheckStatus, PendingTurn, read_pending_turn


@contextmanager
def locked_check_turn(
    run_uuid: UUID | str, *, turn_digest: str | None = None
) -> Iterator[tuple[AgentRun, PendingTurn] | None]:
    """Open a check's transaction: lock the run and yield it with its reconciliation turn, or
    ``None`` when there is nothing a check may record — the run does not wait for
    reconciliation, its turn does not read, or (``turn_digest`` given) it is not the turn the
    check was started for (a person decided first, the run moved on). The caller compares the
    stored check status with what it expects (a compare-and-set) and records the new one with
    ``record_check`` before the block ends, under the lock. A database error becomes
    ``StateWriteFailed``; anything raised in the block rolls it back."""
    try:
        with transaction.atomic():
            run = _lock_run(run_uuid)
            pending = (
                read_pending_turn(run) if run.status == Status.WAITING_FOR_RECONCILIATION else None
            )
            if (
                pending is None
                or pending.kind != RECONCILIATION
                or (turn_digest is not None and pending.turn_digest != turn_digest)
            ):
                yield None
            else:
                yield run, pending
    except DatabaseError as exc:
        raise StateWriteFailed(
            f"a check: the database refused the write ({type(exc).__name__})",
            transition="record_check",
        ) from exc


def record_check(
    run: AgentRun, status: CheckStatus, events: Iterable[EventSpec] = ()
) -> PendingTurn:
    """Record where a check stands on ``run`` — locked by ``locked_check_turn``, whose block
    this must be called in (the statement ``note_check``). Writes only
    ``pending_turn["check"]`` — everything else of the stored turn is kept as it is, digest
    included — and ``events``. Returns the turn written."""
    stored = dict(run.pending_turn) if isinstance(run.pending_turn, dict) else {}
    stored["check"] = status.to_json()
    written = locked_write(
        run, "note_check", {"pending_turn": stored}, events, signer=("", run.lease_epoch)
    )
    if written is None:  # pragma: no cover - impossible under the row lock
        raise StateWriteFailed("a check's record matched no row under the row lock")
    turn = PendingTurn.parse(stored, status=Status.WAITING_FOR_RECONCILIATION, run_uuid=run.uuid)
    name = turn.call.name if turn.call is not None else ""
    tracing.in_doubt(run, by="check", call_name=name, check=status.state, answer=status.answer)
    return turn
