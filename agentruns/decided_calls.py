"""A person's verdict on a call as the timeline shows it, read from the events that record it:
the ``tool`` event of a call denied, answered or run with edited arguments, and the
``approval`` event that lists every call's verdict (docs/design.md §5).

The one reader of those payload keys (``decided_by``, ``reason``, ``edit``, an approval's
``calls[].verdict``): templates use the ``decided_call`` and ``approval_verdicts`` filters
(``agentruns.templatetags.leasehold``), never the raw dict. Every value here was chosen by a
person or a model: plain text, escaped wherever it is shown. Never raises on what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What a ``tool`` event's outcome says of a person's verdict.
DENIED = "denied"
ANSWERED = "answered"
EDITED = "edited"
EXPIRED = "expired"


@dataclass(frozen=True)
class DecidedCall:
    """One call's verdict. ``verdict``: on a ``tool`` event ``denied``, ``answered``,
    ``edited`` or ``expired``; on an ``approval`` event ``approve``, ``deny``, ``answer`` or
    ``edit``. ``by``: the person's username ("" when not recorded). ``answer``: an answer's
    value; ``arguments``: the edited arguments (as run, or as proposed by the edit);
    ``original_arguments``: the model's, when edited."""

    call_id: str
    name: str
    verdict: str
    by: str = ""
    reason: str = ""
    answer: Any = None
    arguments: Any = None
    original_arguments: Any = None

    @property
    def edited(self) -> bool:
        return self.verdict in (EDITED, "edit")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def decided_call(payload: object) -> DecidedCall | None:
    """The verdict a ``tool`` event's payload records, or ``None`` for a call no person
    decided in particular (it ran as proposed, was refused, or was reconciled)."""
    if not isinstance(payload, dict):
        return None
    outcome = payload.get("outcome")
    edit = payload.get("edit")
    common = {
        "call_id": _text(payload.get("call_id")),
        "name": _text(payload.get("name")),
        "by": _text(payload.get("decided_by")),
        "reason": _text(payload.get("reason")),
    }
    if outcome in (DENIED, EXPIRED):
        return DecidedCall(verdict=str(outcome), **common)
    if outcome == ANSWERED:
        return DecidedCall(verdict=ANSWERED, answer=payload.get("result"), **common)
    if isinstance(edit, dict):
        common["by"] = _text(edit.get("editor"))
        return DecidedCall(
            verdict=EDITED,
            arguments=payload.get("arguments"),
            original_arguments=edit.get("original_arguments"),
            **common,
        )
    return None


def approval_verdicts(payload: object) -> tuple[DecidedCall, ...]:
    """Each call's verdict as an ``approval`` event lists it (a whole-turn decision: every call
    ``approve`` or ``deny``, from ``approved``); ``()`` for a payload without calls."""
    if not isinstance(payload, dict) or not isinstance(payload.get("calls"), list):
        return ()
    whole = "approve" if payload.get("approved") is True else "deny"
    decider = _text(payload.get("decider"))
    shown = []
    for call in payload["calls"]:
        if not isinstance(call, dict):
            continue
        verdict = call.get("verdict")
        shown.append(
            DecidedCall(
                call_id=_text(call.get("id")),
                name=_text(call.get("name")),
                verdict=verdict if isinstance(verdict, str) else whole,
                by=decider,
                reason=_text(call.get("reason")) or _text(payload.get("reason")),
                answer=call.get("answer"),
                arguments=call.get("arguments"),
                original_arguments=call.get("original_arguments"),
            )
        )
    return tuple(shown)
