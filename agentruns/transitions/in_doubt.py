"""A tool's automatic check of an in-doubt write: recording where it stands on the waiting run
(``pending_turn["check"]``). Its verdict, when it has one, goes through ``run_decide`` like a
person's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from uuid import UUID

from django.db import transaction

from agentruns.leases import EventSpec
from agentruns.models import Status
from agentruns.transitions._writer import locked_write, state_write
from agentruns.transitions.deciding import _lock_run
from agentruns.turns import RECONCILIATION, CheckStatus, PendingTurn, read_pending_turn

#: ``change(pending) -> the new check status``, or ``None`` to write nothing (not this check's
#: turn any more, a duplicate task, an attempt already started).
CheckChange = Callable[[PendingTurn], "CheckStatus | None"]


@state_write
def run_note_check(
    *,
    run_uuid: UUID | str,
    change: CheckChange,
    turn_digest: str | None = None,
    events: Iterable[EventSpec] = (),
) -> PendingTurn | None:
    """Record a check's progress on a run waiting for reconciliation, under the row lock.

    Guard: ``waiting_for_reconciliation``, a readable reconciliation turn (with ``turn_digest``
    when given: the turn the check was started for) and ``change`` agreeing (a compare-and-set
    on the stored status). Writes only ``pending_turn["check"]`` — everything else of the stored
    turn is kept as it is, digest included — and ``events``. ``None``: refused, nothing written
    (a person decided first, the run moved on, or ``change`` declined); else the turn written.
    """
    with transaction.atomic():
        run = _lock_run(run_uuid)
        if run.status != Status.WAITING_FOR_RECONCILIATION:
            return None
        pending = read_pending_turn(run)
        if pending.kind != RECONCILIATION:
            return None
        if turn_digest is not None and pending.turn_digest != turn_digest:
            return None
        status = change(pending)
        if status is None:
            return None
        stored = dict(run.pending_turn) if isinstance(run.pending_turn, dict) else {}
        stored["check"] = status.to_json()
        if (
            locked_write(
                run, "note_check", {"pending_turn": stored}, events, signer=("", run.lease_epoch)
            )
            is None
        ):  # pragma: no cover - impossible under the row lock
            return None
    return PendingTurn.parse(stored, status=Status.WAITING_FOR_RECONCILIATION, run_uuid=run.uuid)
