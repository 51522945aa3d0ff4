"""What a waiting run shows a human (``AgentRun.pending_turn``), bound by a digest, and how every
interface reads it: ``read_pending_turn``."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils.dateparse import parse_datetime

from agentruns.models import Status
from agentruns.tools.schemas import InvalidSchema, check_schema
from agentruns.turns.calls import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    UNREADABLE,
    Call,
    PendingKind,
    Unreadable,
    canonical_json,
    ordered_arguments,
    turn_digest,
)
from agentruns.turns.checks import CheckStatus

if TYPE_CHECKING:
    from agentruns.models import AgentRun

# The longest question shown above an input form (ask_human's schema allows 2000).
QUESTION_CHARS = 4000

_KIND_FOR_STATUS: dict[str, PendingKind] = {
    Status.WAITING_FOR_APPROVAL: APPROVAL,
    Status.WAITING_FOR_INPUT: INPUT,
    Status.WAITING_FOR_RECONCILIATION: RECONCILIATION,
}


# --- The pending turn (AgentRun.pending_turn) --------------------------------------------------


@dataclass(frozen=True)
class PendingTurn:
    """What a waiting run waits on. ``kind`` is approval, input, reconciliation or unreadable;
    ``problem`` says why an unreadable turn cannot be shown with controls.

    ``calls``: the calls of the turn (approval), the call asking for input (input) or the write
    in flight when its segment died (reconciliation).
    """

    kind: PendingKind
    turn_digest: str = ""
    calls: tuple[Call, ...] = ()
    input_schema: dict[str, Any] | None = None
    # The input schema's property keys as the tool declared them (jsonb may reorder the stored
    # schema's keys); not covered by the digest, only an order for showing the fields.
    field_order: tuple[str, ...] = ()
    idempotency_key: str = ""
    segment: str = ""
    lease_epoch: int | None = None
    lease_expired_at: datetime | None = None
    problem: str = ""
    # reconciliation: why the outcome is unknown when the segment itself parked the run (the
    # tool's words, e.g. a timeout after the request was sent); "" when the segment died.
    reason: str = ""
    # reconciliation: where the tool's automatic check stands (None: the tool has no check, or
    # the run waited before checks existed). Not covered by the digest.
    check: CheckStatus | None = None

    @property
    def readable(self) -> bool:
        return self.kind != UNREADABLE

    @property
    def call(self) -> Call | None:
        """The single call of an input or reconciliation turn."""
        return self.calls[0] if self.calls else None

    @property
    def question(self) -> str:
        """What an input turn asks, as text: the asking call's ``question`` argument when it is
        a string (the convention of ``ask_human`` and any tool that asks a person), bounded to
        ``QUESTION_CHARS``; "" for other turns and calls without one. Shown as the lead text
        above the input form (escaped: the model chose it)."""
        if self.kind != INPUT or self.call is None or not isinstance(self.call.arguments, dict):
            return ""
        question = self.call.arguments.get("question")
        if not isinstance(question, str):
            return ""
        question = question.strip()
        return question if len(question) <= QUESTION_CHARS else question[:QUESTION_CHARS] + "…"

    # -- building --

    @classmethod
    def for_approval(cls, calls: Iterable[Call]) -> PendingTurn:
        """The turn a human approves or denies: every call, detailed for display."""
        shown = tuple(calls)
        return cls(kind=APPROVAL, turn_digest=turn_digest(shown), calls=shown)

    @classmethod
    def for_input(cls, call: Call, input_schema: Mapping[str, Any]) -> PendingTurn:
        """The turn a human supplies values for: ``call`` and the schema its values must meet."""
        schema = dict(input_schema)
        properties = schema.get("properties")
        return cls(
            kind=INPUT,
            turn_digest=turn_digest([call], input_schema=schema),
            calls=(call,),
            input_schema=schema,
            field_order=tuple(properties) if isinstance(properties, dict) else (),
        )

    @classmethod
    def for_reconciliation(cls, run: AgentRun, *, check: CheckStatus | None = None) -> PendingTurn:
        """The turn shown for an in-doubt run: the call its fence stamped (``pending_call``),
        the idempotency key it was sent with and the lease it was running under; ``check`` when
        the call's tool will check it."""
        stamped = run.pending_call if isinstance(run.pending_call, dict) else {}
        call = Call(
            id=str(stamped.get("id") or ""),
            name=str(stamped.get("name") or ""),
            arguments=ordered_arguments(
                stamped.get("arguments", {}), stamped.get("argument_order")
            ),
            effect=str(stamped.get("effect") or run.pending_effect),
        )
        return cls(
            kind=RECONCILIATION,
            turn_digest=turn_digest([call]),
            calls=(call,),
            idempotency_key=f"{run.uuid}:{call.id}",
            segment=run.claimed_by,
            lease_epoch=run.lease_epoch,
            lease_expired_at=run.lease_expires,
            check=check,
        )

    @classmethod
    def in_doubt(
        cls,
        call: Call,
        *,
        run_uuid: object,
        segment: str,
        lease_epoch: int,
        reason: str,
        check: CheckStatus | None = None,
    ) -> PendingTurn:
        """The turn shown for a write whose tool could not tell whether it happened: the call as
        its fence stamped it and why its outcome is unknown."""
        return cls(
            kind=RECONCILIATION,
            turn_digest=turn_digest([call]),
            calls=(call,),
            idempotency_key=f"{run_uuid}:{call.id}",
            segment=segment,
            lease_epoch=lease_epoch,
            reason=reason[:500],
            check=check,
        )

    # -- storing and reading --

    def to_json(self) -> dict[str, Any]:
        if self.kind == APPROVAL:
            return {
                "kind": self.kind,
                "calls": [call.to_json() for call in self.calls],
                "turn_digest": self.turn_digest,
            }
        if self.kind == INPUT and self.call is not None:
            return {
                "kind": self.kind,
                "call": self.call.to_json(),
                "input_schema": self.input_schema,
                "field_order": list(self.field_order),
                "turn_digest": self.turn_digest,
            }
        if self.kind == RECONCILIATION and self.call is not None:
            return {
                "kind": self.kind,
                "call": self.call.to_json(),
                "idempotency_key": self.idempotency_key,
                "segment": self.segment,
                "lease_epoch": self.lease_epoch,
                "lease_expired_at": (
                    self.lease_expired_at.isoformat() if self.lease_expired_at else None
                ),
                "reason": self.reason,
                "turn_digest": self.turn_digest,
                **({"check": self.check.to_json()} if self.check is not None else {}),
            }
        raise ValueError(f"a {self.kind} turn cannot be stored")

    @classmethod
    def parse(cls, raw: object, *, status: str, run_uuid: object = "") -> PendingTurn:
        """The stored pending turn of a run in ``status``; ``Unreadable`` unless its shape is
        right, its kind matches the status, its digest is the digest of exactly the calls (and
        input schema) it shows and an input schema passes ``check_schema`` (a pattern that does
        not compile or a reference outside the schema could never validate a value)."""
        expected = _KIND_FOR_STATUS.get(status)
        if expected is None:
            raise Unreadable(f"the run is not waiting (it is {status})")
        if not isinstance(raw, dict):
            raise Unreadable("no pending turn is stored")
        if raw.get("kind") != expected:
            raise Unreadable(f"the stored turn does not match the run's status ({status})")
        digest = raw.get("turn_digest")
        if not isinstance(digest, str) or not digest:
            raise Unreadable("it has no turn digest")

        parse = {APPROVAL: _approval, INPUT: _input}.get(expected, _reconciliation)
        return parse(raw, digest, run_uuid)


def _approval(raw: dict[str, Any], digest: str, run_uuid: object) -> PendingTurn:
    raw_calls = raw.get("calls")
    if not isinstance(raw_calls, list) or not raw_calls:
        raise Unreadable("it lists no calls")
    calls = tuple(Call.parse(c, where=f"call {i + 1}") for i, c in enumerate(raw_calls))
    _check_digest(digest, turn_digest(calls))
    return PendingTurn(kind=APPROVAL, turn_digest=digest, calls=calls)


def _input(raw: dict[str, Any], digest: str, run_uuid: object) -> PendingTurn:
    call = Call.parse(raw.get("call"), where="the call")
    schema = raw.get("input_schema")
    if not isinstance(schema, dict):
        raise Unreadable("it has no input schema")
    _check_digest(digest, turn_digest([call], input_schema=schema))
    problem = _input_schema_problem(canonical_json(schema))
    if problem:
        raise Unreadable(problem)
    order = raw.get("field_order")
    return PendingTurn(
        kind=INPUT,
        turn_digest=digest,
        calls=(call,),
        input_schema=schema,
        field_order=(
            tuple(k for k in order if isinstance(k, str)) if isinstance(order, list) else ()
        ),
    )


def _reconciliation(raw: dict[str, Any], digest: str, run_uuid: object) -> PendingTurn:
    call = Call.parse(raw.get("call"), where="the call in flight")
    _check_digest(digest, turn_digest([call]))
    expired = raw.get("lease_expired_at")
    epoch = raw.get("lease_epoch")
    return PendingTurn(
        kind=RECONCILIATION,
        turn_digest=digest,
        calls=(call,),
        idempotency_key=str(raw.get("idempotency_key") or f"{run_uuid}:{call.id}"),
        segment=str(raw.get("segment") or ""),
        lease_epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        lease_expired_at=parse_datetime(expired) if isinstance(expired, str) else None,
        reason=str(raw.get("reason") or ""),
        check=CheckStatus.parse(raw.get("check")),
    )


@functools.lru_cache(maxsize=256)
def _input_schema_problem(canonical: str) -> str:
    """Why a stored input schema (its canonical JSON) cannot be used, or ``""``. Cached: every
    read of a waiting run parses its turn, and the metaschema check costs about a millisecond."""
    try:
        check_schema(json.loads(canonical), what="its input schema")
    except InvalidSchema as exc:
        return str(exc)
    return ""


def _check_digest(stored: str, computed: str) -> None:
    if stored != computed:
        raise Unreadable("its digest does not match the calls it shows")


def unreadable(problem: str) -> PendingTurn:
    return PendingTurn(kind=UNREADABLE, problem=problem)


def read_pending_turn(run: AgentRun) -> PendingTurn:
    """The run's pending turn, or an ``unreadable`` one saying why it cannot be decided."""
    try:
        return PendingTurn.parse(run.pending_turn, status=run.status, run_uuid=run.uuid)
    except (Unreadable, ValueError) as exc:
        return unreadable(str(exc) or "its stored turn cannot be read")


def stored_digest(raw_pending_turn: object) -> str:
    """The digest a stored pending turn claims (unchecked; ``""`` when there is none)."""
    if not isinstance(raw_pending_turn, dict):
        return ""
    digest = raw_pending_turn.get("turn_digest")
    return digest if isinstance(digest, str) else ""


def waits_for_a_human(run: AgentRun) -> bool:
    """Whether the run's status is one of the waiting states a human resolves."""
    return run.status in _KIND_FOR_STATUS
