"""Helpers shared by the ``transitions/test_*`` modules and ``races/test_transitions.py``:
identities, a run started through ``run_start``, whole-row snapshots and event lists to compare
before and after a refused write, and leases a segment may hold after losing its claim.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.db import OperationalError
from django.utils import timezone

from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.tools.gate import ToolGate
from agentruns.transitions import _writer, run_claim_queued_row, run_start, run_suspend
from agentruns.turns import Call, LoopState, PendingTurn, Turn
from tests.agentruns.factories import AgentConfigurationFactory

ME = "interactive:host-a:100"
WORKER = "worker:host-b:200"
REAPER = "reaper:host-d:400"
CALL = {"id": "call_1_0", "name": "create_note", "arguments": {"title": "t"}}
# As the runtime builds it: the call as the card shows it (so DIGEST is the digest a card sends).
TURN = PendingTurn.for_approval([ToolGate(allowed=None, narrowed=None).shown(Call(**CALL))])
DIGEST = TURN.turn_digest


#: The loop state a segment suspended on ``TURN`` leaves: the turn a decision lets run.
STATE = LoopState(iteration=1, turn=Turn(calls=list(TURN.calls))).to_json()


def approval_turn(digest: str = DIGEST) -> PendingTurn:
    """The approval turn of ``CALL``; with another ``digest`` a turn that claims it (a later
    turn, for the guards: it never reads as decidable)."""
    return TURN if digest == DIGEST else replace(TURN, turn_digest=digest)


def start(identity: str = ME) -> Lease:
    return run_start(
        configuration=AgentConfigurationFactory(),
        initiator_id=None,
        prompt="hello",
        request={"prompt": "hello"},
        identity=identity,
    )


def claim_lease(*, identity: str, run_id: int | None = None, run_uuid: Any = None) -> Lease | None:
    """A worker's claim of a queued run (``run_claim_queued_row``, as the worker's task makes
    it): the lease it took, or ``None``."""
    claimed = run_claim_queued_row(identity=identity, run_id=run_id, run_uuid=run_uuid)
    return None if claimed is None else claimed.lease


def refuse_event_inserts(patch: Any) -> None:
    """Make the database refuse every event INSERT (a lost connection, a full disk) where it
    runs: in the statement that carries the events — on PostgreSQL the guarded ``UPDATE`` and
    the INSERT are one statement; on SQLite the INSERT after the ``UPDATE`` took the row.
    ``patch``: pytest's ``monkeypatch`` (or one of its contexts)."""
    execute = _writer.execute

    def refusing(statement: str, params: Any) -> Any:
        if params.get("events") not in (None, "[]"):
            raise OperationalError("could not write to file: No space left on device")
        return execute(statement, params)

    patch.setattr(_writer, "execute", refusing)


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
        pending_turn=approval_turn(digest),
        loop_state=STATE,
    )


def reaper_event() -> EventSpec:
    return EventSpec(EventKind.REAPER, {"rule": "test"})


# Leases a segment may still hold after losing its claim.


def wrong_owner(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, "interactive:someone-else:1", lease.epoch, 1)


def wrong_epoch(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, lease.owner, lease.epoch + 1, 1)


def older_epoch(lease: Lease) -> Lease:
    return Lease(lease.run_id, lease.uuid, lease.owner, lease.epoch - 1, 1)
