"""Decisions: read, check and claim under the row lock, in one transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction

from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    UnreadableState,
)
from agentruns.leases import Decided, EventSpec, Lease
from agentruns.models import (
    AgentRun,
    Status,
)
from agentruns.tools.gate import ToolGate
from agentruns.tools.shown import executing_digest, shown_turn
from agentruns.transitions._writer import lease_seconds, locked_write, show, state_write
from agentruns.turns import (
    Decision,
    decided_digests,
    read_pending_turn,
    stored_digest,
    with_decision,
)

# --- Decisions (read, check and claim under the row lock) ----------------------------------------


def _lock_run(run_uuid: UUID | str) -> AgentRun:
    """The run, locked, with its configuration (and approver group) read in the same statement
    (not locked: ``FOR UPDATE OF`` the run only). A decision's checks read the configuration
    from here, and an inline continuation gets the row as it stands (no second read)."""
    try:
        return (
            AgentRun.objects.select_for_update(of=("self",))
            .select_related("configuration__approver_group")
            .get(uuid=run_uuid)
        )
    except (AgentRun.DoesNotExist, ValidationError, ValueError) as exc:
        raise RunNotFound() from exc


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


@state_write
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
    Without, it is ``queued`` for a worker. The wait's ``approval_deadline`` and
    ``approval_timeout_action`` are cleared by the same ``UPDATE``. ``decision`` is recorded in
    the loop state (``turns.with_decision``) and ``event`` is appended in the same transaction:
    audited if and only if it took effect. ``event`` may be a function of the locked run (to name
    what was decided, e.g. the pending calls, from the row the guard checked).

    The returned run is not read back: it shows the row as the write returned it (the statement
    ``decide_queue`` or ``decide_resume``).

    Raises ``RunNotFound``, ``StaleTurn``, ``AlreadyDecided``, ``NotWaiting`` or what ``check``
    raises; nothing changes then.
    """
    with transaction.atomic():
        run = _lock_run(run_uuid)
        _check_turn(run, expected_status=expected_status, turn_digest=turn_digest)
        if check is not None:
            check(run)
        state = with_decision(run.loop_state, decision=decision, turn_digest=turn_digest)
        params: dict[str, Any] = {"status": expected_status, "loop_state": state}
        lease = None
        signer = ("", run.lease_epoch)
        if identity:
            lease = Lease(run.pk, run.uuid, identity, run.lease_epoch + 1, next_sequence=0)
            params.update(owner=identity, epoch=lease.epoch, lease_seconds=lease_seconds())
            signer = (lease.owner, lease.epoch)
        written = event(run) if callable(event) else event
        row = locked_write(
            run,
            "decide_resume" if identity else "decide_queue",
            params,
            [written],
            signer=signer,
            lease=lease,
        )
        if row is None:  # pragma: no cover - impossible under the row lock
            raise NotWaiting()
        show(run, row)
    return Decided(run=run, lease=lease, event=written)


@state_write
def run_reconcile_abandon(
    *,
    run_uuid: UUID | str,
    turn_digest: str | None,
    event: EventSpec,
    check: Callable[[AgentRun], None] | None = None,
) -> AgentRun:
    """Settle an in-doubt run ``failed`` / ``reconciled_abandoned`` under the row lock.

    Guard: ``waiting_for_reconciliation`` and the digest of the in-doubt call (the statement
    ``reconcile_abandon``). Raises as ``run_decide``.
    """
    with transaction.atomic():
        run = _lock_run(run_uuid)
        _check_turn(run, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=turn_digest)
        if check is not None:
            check(run)
        state = with_decision(run.loop_state, decision=None, turn_digest=turn_digest)
        row = locked_write(
            run, "reconcile_abandon", {"loop_state": state}, [event], signer=("", run.lease_epoch)
        )
        if row is None:  # pragma: no cover - impossible under the row lock
            raise NotWaiting()
        show(run, row)
    return run
