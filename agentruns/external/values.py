"""The values the external surface hands a framework's adapter: a proposed call, what became of
it, the card a person decides on, and a call's verdict. Plain, JSON-friendly, no queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: ``CallOutcome.outcome`` values: those of a ``tool`` event (docs/design.md §1.9).
EXECUTED = "executed"
DENIED = "denied"


@dataclass(frozen=True)
class ProposedCall:
    """One tool call the framework's model proposed: the framework's own call id (a LangGraph
    ``tool_call["id"]``, an Agents SDK ``call_id``), the tool's registered name and the
    arguments as proposed. The same id with the same arguments is the same call, whenever it
    is proposed again (a replay, a fork, a resume): its recorded outcome is returned."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallOutcome:
    """What became of a call, as the run's ``tool`` event recorded it. ``outcome``: executed,
    refused, denied, answered, expired, invalid_arguments, reconciled_landed or
    reconciled_not_landed; ``message``: the tool message the model reads (the result, or who
    denied it and why — hand it to the framework as the tool's output); ``recorded``: returned
    from the ledger, not run now (a replay); ``idempotency_key``: what the tool was given."""

    call_id: str
    name: str
    outcome: str
    ok: bool
    result: Any
    error: str
    message: str
    idempotency_key: str
    recorded: bool = False
    reason: str = ""
    decided_by: str = ""

    @property
    def ran(self) -> bool:
        return self.outcome == EXECUTED


@dataclass(frozen=True)
class Card:
    """What a person decides on, as the inbox shows it: the run, its status, the pending turn's
    kind and digest, and each call as shown (effect, whether it needs a decision, preview). A
    framework puts ``to_json()`` in its own pause (LangGraph's ``interrupt``); the decision is
    made in Leasehold's inbox and binds to ``turn_digest``."""

    run_uuid: str
    framework: str
    status: str
    kind: str
    turn_digest: str
    calls: tuple[dict[str, Any], ...] = ()
    review_path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "leasehold_run": self.run_uuid,
            "framework": self.framework,
            "status": self.status,
            "kind": self.kind,
            "turn_digest": self.turn_digest,
            "calls": [dict(call) for call in self.calls],
            "review_path": self.review_path,
        }


#: ``Verdict.state`` values.
APPROVED = "approved"
UNDECIDED = "undecided"
DONE = "done"


@dataclass(frozen=True)
class Verdict:
    """Where a proposed call stands now: ``approved`` (it may run: approved by a person, or it
    needs no decision), ``undecided`` (the run must pause for a person), or ``denied`` /
    ``done`` (it will never run now: its ``outcome`` says what the model reads — a denial with
    the reviewer's ``reason``, an answer, a result recorded earlier)."""

    call_id: str
    state: str
    outcome: CallOutcome | None = None

    @property
    def reason(self) -> str:
        return self.outcome.reason if self.outcome is not None else ""
