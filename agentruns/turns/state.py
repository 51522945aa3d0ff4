"""The segment's own record of a run (``AgentRun.loop_state``): the turn being executed, a
decision waiting to be applied, the digests already decided, token usage and how many times a
final answer was sent back for not matching the output schema."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeAlias

from agentruns.turns.call_verdicts import CallVerdict, parse_verdicts
from agentruns.turns.calls import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    Call,
    Unreadable,
    _int,
    _strings,
)

#: How many decided digests ``loop_state`` remembers (to answer "already decided").
DECIDED_DIGESTS_KEPT = 50


# --- The stored turn (loop_state.turn) ---------------------------------------------------------


@dataclass
class Turn:
    """The turn a segment is executing: the model's calls in order, the ids already done
    (executed, denied or reconciled), the approval decision (``None``: none yet), the values
    a human supplied per call id, and who denied it when nobody did in person (``denied_by``:
    ``"deadline"`` — the approval deadline passed; empty otherwise). A person's whole-turn
    denial keeps their username (``decider``) and their reason (``reason``) for the model."""

    calls: list[Call]
    done: list[str] = field(default_factory=list)
    approved: bool | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    denied_by: str = ""
    decider: str = ""
    reason: str = ""

    def open_calls(self) -> list[Call]:
        """The calls not done yet: what an approval of this turn lets run."""
        return [call for call in self.calls if call.id not in self.done]

    def call(self, call_id: str) -> Call | None:
        return next((call for call in self.calls if call.id == call_id), None)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "calls": [call.to_json() for call in self.calls],
            "done": list(self.done),
            "approved": self.approved,
            "inputs": dict(self.inputs),
        }
        if self.denied_by:
            data["denied_by"] = self.denied_by
        if self.decider:
            data["decider"] = self.decider
        if self.reason:
            data["reason"] = self.reason
        return data

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
        inputs = raw.get("inputs")
        inputs = {} if inputs is None else inputs
        if not isinstance(inputs, dict):
            raise Unreadable("loop_state.turn.inputs is malformed")
        denied_by = raw.get("denied_by", "")
        if denied_by not in DENIERS:
            raise Unreadable("loop_state.turn was denied by an unknown party")
        return cls(
            calls=calls,
            done=_strings(raw.get("done"), "loop_state.turn.done"),
            approved=approved,
            inputs=dict(inputs),
            denied_by=str(denied_by),
            decider=_text(raw.get("decider"), "loop_state.turn.decider"),
            reason=_text(raw.get("reason"), "loop_state.turn.reason"),
        )


# --- Decisions (loop_state.decision) ----------------------------------------------------------


#: Who may deny a turn without a person: ``""`` (a person did) or ``"deadline"`` (the approval
#: deadline passed, docs/design.md §5.11).
DEADLINE = "deadline"
DENIERS = ("", DEADLINE)


@dataclass(frozen=True)
class ApprovalDecision:
    """A human decided the pending turn whose digest was ``turn_digest`` — or (``by="deadline"``,
    a denial only) nobody decided before its approval deadline.

    Whole turn (``verdicts`` empty): ``approved`` says for every call alike; a denial may carry
    the person's ``reason``. Per call (``verdicts``: one per open call, in the turn's order):
    ``approved`` says whether any call was approved. ``decider``: the person's username, which
    the model reads with a denial or an answer and which an edit records as the author."""

    approved: bool
    decider_id: int | None = None
    turn_digest: str = ""
    by: str = "person"
    verdicts: tuple[CallVerdict, ...] = ()
    decider: str = ""
    reason: str = ""
    kind: Literal["approval"] = "approval"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "approved": self.approved,
            "decider_id": self.decider_id,
            "turn_digest": self.turn_digest,
        }
        if self.by != "person":
            data["by"] = self.by
        if self.verdicts:
            data["verdicts"] = [verdict.to_json() for verdict in self.verdicts]
        if self.decider:
            data["decider"] = self.decider
        if self.reason:
            data["reason"] = self.reason
        return data


@dataclass(frozen=True)
class InputDecision:
    """A human supplied the values the call ``call_id`` asked for, on the turn ``turn_digest``."""

    call_id: str
    values: Any
    decider_id: int | None = None
    turn_digest: str = ""
    kind: Literal["input"] = "input"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "call_id": self.call_id,
            "values": self.values,
            "decider_id": self.decider_id,
            "turn_digest": self.turn_digest,
        }


@dataclass(frozen=True)
class ReconciliationDecision:
    """A human (``by="person"``) or the tool's automatic check (``by="check"``) said whether the
    in-doubt write ``call`` landed (``landed``/``not_landed``); a check that found it landed may
    give the ``result`` the model sees."""

    verdict: str
    call: Call | None
    decider_id: int | None = None
    by: str = "person"
    result: Any = None
    kind: Literal["reconciliation"] = "reconciliation"

    @property
    def landed(self) -> bool:
        return self.verdict == "landed"

    def to_json(self) -> dict[str, Any]:
        data = {
            "kind": self.kind,
            "verdict": self.verdict,
            "call": self.call.to_json() if self.call is not None else None,
            "decider_id": self.decider_id,
        }
        if self.by != "person":
            data.update(by=self.by, result=self.result)
        return data


Decision: TypeAlias = ApprovalDecision | InputDecision | ReconciliationDecision


def _text(raw: object, where: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise Unreadable(f"{where} is not text")
    return raw


def _decider(raw: dict[str, Any]) -> int | None:
    decider = raw.get("decider_id")
    return decider if isinstance(decider, int) and not isinstance(decider, bool) else None


def _digest_of(raw: dict[str, Any]) -> str:
    digest = raw.get("turn_digest")
    return digest if isinstance(digest, str) else ""


def parse_decision(raw: object) -> Decision:
    """A stored decision; ``Unreadable`` for a malformed one or an unknown kind."""
    if not isinstance(raw, dict):
        raise Unreadable("loop_state.decision is malformed")
    kind = raw.get("kind")
    if kind == APPROVAL:
        approved = raw.get("approved")
        if not isinstance(approved, bool):
            raise Unreadable("loop_state.decision.approved is not true or false")
        by = raw.get("by", "person")
        if by not in ("person", DEADLINE) or (by == DEADLINE and approved):
            raise Unreadable("loop_state.decision was made by an unknown party")
        return ApprovalDecision(
            approved=approved,
            decider_id=_decider(raw),
            turn_digest=_digest_of(raw),
            by=str(by),
            verdicts=parse_verdicts(raw.get("verdicts"), where="loop_state.decision.verdicts"),
            decider=_text(raw.get("decider"), "loop_state.decision.decider"),
            reason=_text(raw.get("reason"), "loop_state.decision.reason"),
        )
    if kind == INPUT:
        call_id = raw.get("call_id")
        if not isinstance(call_id, str):
            raise Unreadable("loop_state.decision has no call id")
        return InputDecision(
            call_id=call_id,
            values=raw.get("values", {}),
            decider_id=_decider(raw),
            turn_digest=_digest_of(raw),
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
        by = raw.get("by", "person")
        if by not in ("person", "check"):
            raise Unreadable("loop_state.decision was made by an unknown party")
        return ReconciliationDecision(
            verdict=str(verdict),
            call=call,
            decider_id=_decider(raw),
            by=str(by),
            result=raw.get("result"),
        )
    raise Unreadable(f"loop_state.decision has an unknown kind {kind!r}")


# --- The loop state ---------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # What the run's answers cost so far (agentruns.budgets); stored as a decimal string, and
    # only once it is not zero.
    cost: Decimal = Decimal(0)

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
    decided"; ``output_repairs`` how many final answers were sent back for not matching the
    configuration's output schema (``services.runtime.structured_output``). Keys this version
    does not know are kept as they were (``extra``).
    """

    iteration: int = 0
    turn: Turn | None = None
    decision: Decision | None = None
    decided_digests: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    output_repairs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    _KNOWN = ("iteration", "turn", "decision", "decided_digests", "usage", "output_repairs")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self.extra,
            "iteration": self.iteration,
            "turn": self.turn.to_json() if self.turn is not None else None,
            "usage": {
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
                **({"cost": str(self.usage.cost)} if self.usage.cost else {}),
            },
        }
        if self.decision is not None:
            data["decision"] = self.decision.to_json()
        if self.decided_digests:
            data["decided_digests"] = list(self.decided_digests)
        if self.output_repairs:
            data["output_repairs"] = self.output_repairs
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
        usage = raw.get("usage")
        usage = {} if usage is None else usage
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
                cost=_cost(usage.get("cost")),
            ),
            output_repairs=_int(raw.get("output_repairs"), "loop_state.output_repairs"),
            extra={k: v for k, v in raw.items() if k not in cls._KNOWN},
        )


def _cost(value: object) -> Decimal:
    if value is None:
        return Decimal(0)
    try:
        cost = Decimal(value) if isinstance(value, str) else None
    except InvalidOperation:
        cost = None
    if cost is None or not cost.is_finite() or cost < 0:
        raise Unreadable("loop_state.usage.cost is not a decimal string")
    return cost


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
