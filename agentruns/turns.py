"""The run's JSON, typed: the stored turn, the pending turn, decisions and the loop state
(docs/design.md §1.2).

A run keeps its progress in two JSON columns. ``loop_state`` is the segment's own record (the
round, the turn being executed, a human's decision waiting to be applied, the digests already
decided, token usage); ``pending_turn`` is what a waiting run shows a human (the calls to approve,
the call asking for input, the write in doubt) bound by a digest. This module is the only place
that builds, parses and serialises them, and the only place that computes a turn's digest:

* every value ``parse``\\ s itself from stored JSON, refusing malformed data with ``Unreadable``
  (its message says why, in words a person can read), and writes itself back with ``to_json``;
* ``read_pending_turn(run)`` is how every interface (runtime, inbox, playground, API) reads a
  waiting run: a turn whose shape, kind or digest does not agree reads as ``unreadable`` —
  shown without controls, the same way everywhere.

Free of queries: it looks at the values it is given, nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from django.utils.dateparse import parse_datetime

from agentruns.models import Effect, Status

if TYPE_CHECKING:
    from agentruns.models import AgentRun

APPROVAL = "approval"
INPUT = "input"
RECONCILIATION = "reconciliation"
UNREADABLE = "unreadable"
PendingKind: TypeAlias = Literal["approval", "input", "reconciliation", "unreadable"]

#: How many decided digests ``loop_state`` remembers (to answer "already decided").
DECIDED_DIGESTS_KEPT = 50

_KIND_FOR_STATUS: dict[str, PendingKind] = {
    Status.WAITING_FOR_APPROVAL: APPROVAL,
    Status.WAITING_FOR_INPUT: INPUT,
    Status.WAITING_FOR_RECONCILIATION: RECONCILIATION,
}


class Unreadable(ValueError):
    """Stored JSON that does not parse. The message is the reason, e.g. "it lists no calls"."""


def _object(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise Unreadable(f"{where} is not an object")
    return raw


def _int(raw: object, where: str, default: int = 0) -> int:
    if raw is None:
        return default
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise Unreadable(f"{where} is not an integer")
    return raw


def _strings(raw: object, where: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise Unreadable(f"{where} is not a list of strings")
    return list(raw)


# --- Digests ----------------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_digest(
    calls: Iterable[Call | Mapping[str, Any]], *, input_schema: Mapping[str, Any] | None = None
) -> str:
    """SHA-256 of the canonical JSON of the calls (id, name and arguments) — what binds a human
    decision to the turn the human saw (docs/design.md §5.2).

    The call id is included beside the name and arguments so that a model proposing the very
    same call in a later turn gets a new digest: a decision for the old turn is then "already
    decided", never silently valid for the new one. An input digest also covers the schema.
    """
    digested = [
        call.digested() if isinstance(call, Call) else _digested_mapping(call) for call in calls
    ]
    body: dict[str, Any] = {"calls": digested}
    if input_schema is not None:
        body["input_schema"] = input_schema
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def _digested_mapping(call: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call.get("id"), "name": call.get("name"), "arguments": call.get("arguments")}


# --- Calls ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One tool call the model proposed: its id (unique within the run), tool name, arguments
    and the tool's effect as known when it was proposed.

    An approval turn's calls also carry what the approver is shown (``detailed``): whether the
    call needs a decision, whether its tool is known, where it comes from and its hints.
    """

    id: str
    name: str
    arguments: Any = None
    effect: str = ""  # "" when not recorded (an older stored turn)
    needs_approval: bool = True
    known: bool = True
    source: str = "local"
    hints: dict[str, Any] = field(default_factory=dict)
    detailed: bool = False

    @property
    def effect_label(self) -> str:
        return str(Effect(self.effect).label) if self.effect in Effect.values else self.effect

    @property
    def is_write(self) -> bool:
        return self.effect != Effect.READ

    def digested(self) -> dict[str, Any]:
        """What a digest covers: id, name and arguments."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "effect": self.effect,
        }
        if self.detailed:
            data.update(
                needs_approval=self.needs_approval,
                known=self.known,
                source=self.source,
                hints=dict(self.hints),
            )
        return data

    @classmethod
    def parse(cls, raw: object, *, where: str, effect_required: bool = True) -> Call:
        """A stored call. Refuses a call without a string id or a tool name, and (unless
        ``effect_required`` is false) one whose effect is not a known effect."""
        data = _object(raw, where)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise Unreadable(f"{where} has no tool name")
        call_id = data.get("id")
        if not isinstance(call_id, str):
            raise Unreadable(f"{where} has no call id")
        effect = data.get("effect")
        if effect is None and not effect_required:
            effect = ""
        elif effect not in Effect.values:
            raise Unreadable(f"{where} has an unknown effect")
        hints = data.get("hints")
        return cls(
            id=call_id,
            name=name,
            arguments=data.get("arguments", {}),
            effect=str(effect),
            needs_approval=data.get("needs_approval", True) is not False,
            known=data.get("known", True) is not False,
            source=str(data.get("source") or "local"),
            hints=dict(hints) if isinstance(hints, dict) else {},
            detailed="needs_approval" in data or "known" in data or "hints" in data,
        )


# --- The stored turn (loop_state.turn) ---------------------------------------------------------


@dataclass
class Turn:
    """The turn a segment is executing: the model's calls in order, the ids already done
    (executed, denied or reconciled), the approval decision (``None``: none yet) and the values
    a human supplied per call id."""

    calls: list[Call]
    done: list[str] = field(default_factory=list)
    approved: bool | None = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": [call.to_json() for call in self.calls],
            "done": list(self.done),
            "approved": self.approved,
            "inputs": dict(self.inputs),
        }

    @classmethod
    def parse(cls, raw: object) -> Turn:
        if not isinstance(raw, dict) or not isinstance(raw.get("calls"), list):
            raise Unreadable("loop_state.turn is malformed")
        calls = []
        for index, call in enumerate(raw["calls"]):
            if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                raise Unreadable("loop_state.turn has a malformed call")
            if not isinstance(call.get("name"), str):
                raise Unreadable("loop_state.turn has a call without a name")
            calls.append(
                Call.parse(call, where=f"loop_state.turn call {index + 1}", effect_required=False)
            )
        if not isinstance(raw.get("done", []), list):
            raise Unreadable("loop_state.turn.done is malformed")
        approved = raw.get("approved")
        if approved is not None and not isinstance(approved, bool):
            raise Unreadable("loop_state.turn.approved is not true, false or null")
        inputs = raw.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise Unreadable("loop_state.turn.inputs is malformed")
        return cls(
            calls=calls,
            done=_strings(raw.get("done"), "loop_state.turn.done"),
            approved=approved,
            inputs=dict(inputs),
        )


# --- Decisions (loop_state.decision) ----------------------------------------------------------


@dataclass(frozen=True)
class ApprovalDecision:
    """A human approved or denied the whole pending turn."""

    approved: bool
    decider_id: int | None = None
    kind: Literal["approval"] = "approval"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "approved": self.approved, "decider_id": self.decider_id}


@dataclass(frozen=True)
class InputDecision:
    """A human supplied the values the call ``call_id`` asked for."""

    call_id: str
    values: Any
    decider_id: int | None = None
    kind: Literal["input"] = "input"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "call_id": self.call_id,
            "values": self.values,
            "decider_id": self.decider_id,
        }


@dataclass(frozen=True)
class ReconciliationDecision:
    """A human said whether the in-doubt write ``call`` landed (``landed``/``not_landed``)."""

    verdict: str
    call: Call | None
    decider_id: int | None = None
    kind: Literal["reconciliation"] = "reconciliation"

    @property
    def landed(self) -> bool:
        return self.verdict == "landed"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "verdict": self.verdict,
            "call": self.call.to_json() if self.call is not None else None,
            "decider_id": self.decider_id,
        }


Decision: TypeAlias = ApprovalDecision | InputDecision | ReconciliationDecision


def _decider(raw: dict[str, Any]) -> int | None:
    decider = raw.get("decider_id")
    return decider if isinstance(decider, int) and not isinstance(decider, bool) else None


def parse_decision(raw: object) -> Decision:
    """A stored decision; ``Unreadable`` for a malformed one or an unknown kind."""
    if not isinstance(raw, dict):
        raise Unreadable("loop_state.decision is malformed")
    kind = raw.get("kind")
    if kind == APPROVAL:
        approved = raw.get("approved")
        if not isinstance(approved, bool):
            raise Unreadable("loop_state.decision.approved is not true or false")
        return ApprovalDecision(approved=approved, decider_id=_decider(raw))
    if kind == INPUT:
        call_id = raw.get("call_id")
        if not isinstance(call_id, str):
            raise Unreadable("loop_state.decision has no call id")
        return InputDecision(
            call_id=call_id, values=raw.get("values", {}), decider_id=_decider(raw)
        )
    if kind == RECONCILIATION:
        verdict = raw.get("verdict")
        if verdict not in ("landed", "not_landed"):
            raise Unreadable("loop_state.decision has an unknown verdict")
        stored_call = raw.get("call")
        call = (
            Call.parse(stored_call, where="loop_state.decision.call", effect_required=False)
            if stored_call is not None
            else None
        )
        return ReconciliationDecision(verdict=str(verdict), call=call, decider_id=_decider(raw))
    raise Unreadable(f"loop_state.decision has an unknown kind {kind!r}")


# --- The loop state ---------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, usage: Mapping[str, Any]) -> None:
        """Add a provider's reported usage (missing or empty counts are zero)."""
        self.prompt_tokens += int(usage.get("prompt_tokens", 0) or 0)
        self.completion_tokens += int(usage.get("completion_tokens", 0) or 0)


@dataclass
class LoopState:
    """A segment's record of its run (``AgentRun.loop_state``), saved at every step boundary.

    ``iteration`` counts provider calls; ``turn`` is the turn being executed (``None`` between
    turns); ``decision`` a human's decision recorded while the run waited, applied by the next
    segment; ``decided_digests`` the last digests decided, so a repeated decision reads "already
    decided". Keys this version does not know are kept as they were (``extra``).
    """

    iteration: int = 0
    turn: Turn | None = None
    decision: Decision | None = None
    decided_digests: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("iteration", "turn", "decision", "decided_digests", "usage")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self.extra,
            "iteration": self.iteration,
            "turn": self.turn.to_json() if self.turn is not None else None,
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
            },
        }
        if self.decision is not None:
            data["decision"] = self.decision.to_json()
        if self.decided_digests:
            data["decided_digests"] = list(self.decided_digests)
        return data

    @classmethod
    def parse(cls, raw: object) -> LoopState:
        """The stored loop state (``None`` is an empty one); ``Unreadable`` when corrupt."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise Unreadable("loop_state is not an object")
        if not isinstance(raw.get("iteration", 0), int):
            raise Unreadable("loop_state.iteration is not an integer")
        turn = raw.get("turn")
        decision = raw.get("decision")
        usage = raw.get("usage") or {}
        if not isinstance(usage, dict):
            raise Unreadable("loop_state.usage is malformed")
        return cls(
            iteration=_int(raw.get("iteration"), "loop_state.iteration"),
            turn=Turn.parse(turn) if turn is not None else None,
            decision=parse_decision(decision) if decision is not None else None,
            decided_digests=_strings(raw.get("decided_digests"), "loop_state.decided_digests"),
            usage=Usage(
                prompt_tokens=_int(usage.get("prompt_tokens"), "loop_state.usage.prompt_tokens"),
                completion_tokens=_int(
                    usage.get("completion_tokens"), "loop_state.usage.completion_tokens"
                ),
            ),
            extra={k: v for k, v in raw.items() if k not in cls._KNOWN},
        )


def with_decision(
    raw_state: object, *, decision: Decision | None, turn_digest: str | None
) -> dict[str, Any]:
    """The stored loop state ``raw_state`` with ``decision`` recorded (when given) and
    ``turn_digest`` added to the decided digests — everything else kept exactly as stored.

    Used by the decision transitions under the row lock: a loop state this version cannot parse
    is left for the continuing segment to refuse (``not_resumable``), not rewritten here.
    """
    state = dict(raw_state) if isinstance(raw_state, dict) else {}
    if decision is not None:
        state["decision"] = decision.to_json()
    state["decided_digests"] = [*decided_digests(state), turn_digest][-DECIDED_DIGESTS_KEPT:]
    return state


def decided_digests(raw_state: object) -> list[str]:
    """The digests already decided on the run whose loop state is ``raw_state`` (leniently:
    anything unreadable counts as none)."""
    if not isinstance(raw_state, dict):
        return []
    digests = raw_state.get("decided_digests")
    return [d for d in digests if isinstance(d, str)] if isinstance(digests, list) else []


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

    @property
    def readable(self) -> bool:
        return self.kind != UNREADABLE

    @property
    def call(self) -> Call | None:
        """The single call of an input or reconciliation turn."""
        return self.calls[0] if self.calls else None

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
    def for_reconciliation(cls, run: AgentRun) -> PendingTurn:
        """The turn shown for an in-doubt run: the call its fence stamped (``pending_call``),
        the idempotency key it was sent with and the lease it was running under."""
        stamped = run.pending_call if isinstance(run.pending_call, dict) else {}
        call = Call(
            id=str(stamped.get("id") or ""),
            name=str(stamped.get("name") or ""),
            arguments=stamped.get("arguments", {}),
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
                "turn_digest": self.turn_digest,
            }
        raise ValueError(f"a {self.kind} turn cannot be stored")

    @classmethod
    def parse(cls, raw: object, *, status: str, run_uuid: object = "") -> PendingTurn:
        """The stored pending turn of a run in ``status``; ``Unreadable`` unless its shape is
        right, its kind matches the status and its digest is the digest of exactly the calls
        (and input schema) it shows."""
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

        if expected == APPROVAL:
            raw_calls = raw.get("calls")
            if not isinstance(raw_calls, list) or not raw_calls:
                raise Unreadable("it lists no calls")
            calls = tuple(Call.parse(c, where=f"call {i + 1}") for i, c in enumerate(raw_calls))
            _check_digest(digest, turn_digest(calls))
            return cls(kind=APPROVAL, turn_digest=digest, calls=calls)

        if expected == INPUT:
            call = Call.parse(raw.get("call"), where="the call")
            schema = raw.get("input_schema")
            if not isinstance(schema, dict):
                raise Unreadable("it has no input schema")
            _check_digest(digest, turn_digest([call], input_schema=schema))
            order = raw.get("field_order")
            return cls(
                kind=INPUT,
                turn_digest=digest,
                calls=(call,),
                input_schema=schema,
                field_order=(
                    tuple(k for k in order if isinstance(k, str)) if isinstance(order, list) else ()
                ),
            )

        call = Call.parse(raw.get("call"), where="the call in flight")
        _check_digest(digest, turn_digest([call]))
        expired = raw.get("lease_expired_at")
        epoch = raw.get("lease_epoch")
        return cls(
            kind=RECONCILIATION,
            turn_digest=digest,
            calls=(call,),
            idempotency_key=str(raw.get("idempotency_key") or f"{run_uuid}:{call.id}"),
            segment=str(raw.get("segment") or ""),
            lease_epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
            lease_expired_at=parse_datetime(expired) if isinstance(expired, str) else None,
        )


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
