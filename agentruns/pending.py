"""Reading a waiting run's stored pending turn (RUNS.md §6, §8) for anyone who shows it.

``read_pending_turn(run)`` turns the ``pending_turn`` JSON into a typed value or says why it
cannot: a turn is shown with controls only when its shape is right, it matches the run's status
and its stored ``turn_digest`` is the digest of exactly the calls (and input schema) it shows —
so a decision bound to that digest is bound to what the human saw. Anything else reads as
``unreadable`` and must be shown without controls.

Read-only and free of queries: it looks at the row it is given, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from agentruns.digests import turn_digest
from agentruns.models import AgentRun, Effect, Status

APPROVAL = "approval"
INPUT = "input"
RECONCILIATION = "reconciliation"
UNREADABLE = "unreadable"

_KIND_FOR_STATUS = {
    Status.WAITING_FOR_APPROVAL: APPROVAL,
    Status.WAITING_FOR_INPUT: INPUT,
    Status.WAITING_FOR_RECONCILIATION: RECONCILIATION,
}


@dataclass(frozen=True)
class PendingCall:
    """One call of a pending turn, as stored when the run suspended."""

    id: str
    name: str
    arguments: Any
    effect: str
    known: bool = True
    source: str = "local"

    @property
    def effect_label(self) -> str:
        return Effect(self.effect).label

    @property
    def is_write(self) -> bool:
        return self.effect != Effect.READ


@dataclass(frozen=True)
class PendingTurn:
    """What a waiting run waits on. ``kind`` is one of approval, input, reconciliation,
    unreadable; ``problem`` says why an unreadable turn cannot be shown with controls."""

    kind: str
    turn_digest: str = ""
    calls: tuple[PendingCall, ...] = ()
    input_schema: dict[str, Any] | None = None
    # The input schema's property keys as the tool declared them (jsonb may reorder the stored
    # schema's keys); not covered by the digest, only an order for showing the fields.
    field_order: tuple[str, ...] = ()
    idempotency_key: str = ""
    segment: str = ""
    lease_epoch: int | None = None
    lease_expired_at: datetime | None = None
    problem: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return self.kind != UNREADABLE

    @property
    def call(self) -> PendingCall | None:
        """The single call of an input or reconciliation turn."""
        return self.calls[0] if self.calls else None


class _Unreadable(ValueError):
    pass


def _unreadable(problem: str) -> PendingTurn:
    return PendingTurn(kind=UNREADABLE, problem=problem)


def _call(raw: Any, *, where: str) -> PendingCall:
    if not isinstance(raw, dict):
        raise _Unreadable(f"{where} is not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _Unreadable(f"{where} has no tool name")
    call_id = raw.get("id")
    if not isinstance(call_id, str):
        raise _Unreadable(f"{where} has no call id")
    effect = raw.get("effect")
    if effect not in Effect.values:
        raise _Unreadable(f"{where} has an unknown effect")
    return PendingCall(
        id=call_id,
        name=name,
        arguments=raw.get("arguments"),
        effect=effect,
        known=raw.get("known", True) is not False,
        source=str(raw.get("source") or "local"),
    )


def _digest(raw: dict[str, Any]) -> str:
    digest = raw.get("turn_digest")
    if not isinstance(digest, str) or not digest:
        raise _Unreadable("it has no turn digest")
    return digest


def _check_digest(stored: str, computed: str) -> None:
    if stored != computed:
        raise _Unreadable("its digest does not match the calls it shows")


def _read(run: AgentRun) -> PendingTurn:
    expected = _KIND_FOR_STATUS.get(run.status)
    if expected is None:
        raise _Unreadable(f"the run is not waiting (it is {run.status})")
    raw = run.pending_turn
    if not isinstance(raw, dict):
        raise _Unreadable("no pending turn is stored")
    if raw.get("kind") != expected:
        raise _Unreadable(f"the stored turn does not match the run's status ({run.status})")
    digest = _digest(raw)

    if expected == APPROVAL:
        raw_calls = raw.get("calls")
        if not isinstance(raw_calls, list) or not raw_calls:
            raise _Unreadable("it lists no calls")
        calls = tuple(_call(c, where=f"call {i + 1}") for i, c in enumerate(raw_calls))
        _check_digest(digest, turn_digest([_as_digested(c) for c in calls]))
        return PendingTurn(kind=APPROVAL, turn_digest=digest, calls=calls)

    if expected == INPUT:
        call = _call(raw.get("call"), where="the call")
        schema = raw.get("input_schema")
        if not isinstance(schema, dict):
            raise _Unreadable("it has no input schema")
        _check_digest(digest, turn_digest([_as_digested(call)], input_schema=schema))
        order = raw.get("field_order")
        return PendingTurn(
            kind=INPUT,
            turn_digest=digest,
            calls=(call,),
            input_schema=schema,
            field_order=tuple(k for k in order if isinstance(k, str))
            if isinstance(order, list)
            else (),
        )

    call = _call(raw.get("call"), where="the call in flight")
    _check_digest(digest, turn_digest([_as_digested(call)]))
    expired = raw.get("lease_expired_at")
    epoch = raw.get("lease_epoch")
    return PendingTurn(
        kind=RECONCILIATION,
        turn_digest=digest,
        calls=(call,),
        idempotency_key=str(raw.get("idempotency_key") or f"{run.uuid}:{call.id}"),
        segment=str(raw.get("segment") or ""),
        lease_epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        lease_expired_at=parse_datetime(expired) if isinstance(expired, str) else None,
    )


def _as_digested(call: PendingCall) -> dict[str, Any]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def read_pending_turn(run: AgentRun) -> PendingTurn:
    """The run's pending turn, or an ``unreadable`` one saying why it cannot be decided here."""
    try:
        return _read(run)
    except (_Unreadable, ValueError) as exc:
        return _unreadable(str(exc) or "its stored turn cannot be read")


def waits_for_a_human(run: AgentRun) -> bool:
    """Whether the run's status is one of the waiting states a human resolves."""
    return run.status in _KIND_FOR_STATUS
