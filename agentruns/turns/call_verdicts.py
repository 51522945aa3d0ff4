"""A person's verdict on one call of a pending turn (docs/design.md §5): approve it, deny it
(with an optional reason the model reads), answer it in place of running it, or edit its
arguments (a new card follows; an edit is not an approval).

``CallVerdict`` is the one typed value every interface builds (the inbox's and the playground's
forms, the API's serializer) and the decision service checks and records; it parses and writes
itself as stored in ``loop_state.decision.verdicts``. Free of queries and of Django.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from agentruns.turns.calls import Unreadable, canonical_json

APPROVE: Final = "approve"
DENY: Final = "deny"
ANSWER: Final = "answer"
EDIT: Final = "edit"
#: Every verdict, in the order a card offers them.
VERDICTS: Final = (APPROVE, DENY, ANSWER, EDIT)
VerdictName: TypeAlias = Literal["approve", "deny", "answer", "edit"]

#: The longest reason a person may give (plain text, characters).
MAX_REASON_CHARS: Final = 2_000
#: The longest answer a person may give (characters of its canonical JSON; text counts as is).
MAX_ANSWER_CHARS: Final = 20_000
#: The deepest JSON an answer or edited arguments may nest.
MAX_VERDICT_DEPTH: Final = 20


@dataclass(frozen=True)
class CallVerdict:
    """What a person decided for the call ``call_id``.

    ``reason``: a denial's words for the model (any verdict may carry one; the model reads it
    with a denial). ``answer``: the result the model receives in place of running the tool
    (``answer``: a JSON value or text, never ``None``). ``arguments``: the edited arguments
    (``edit``: a JSON object, validated against the tool's schema before anything is
    recorded)."""

    call_id: str
    verdict: VerdictName
    reason: str = ""
    answer: Any = None
    arguments: Any = None

    @property
    def runs(self) -> bool:
        """Whether this verdict lets the call's tool run (an approval)."""
        return self.verdict == APPROVE

    @property
    def needs_approve_authority(self) -> bool:
        """Approve, answer and edit need the call's approve authority; deny needs deciding."""
        return self.verdict != DENY

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.call_id, "verdict": self.verdict}
        if self.reason:
            data["reason"] = self.reason
        if self.verdict == ANSWER:
            data["answer"] = self.answer
        if self.verdict == EDIT:
            data["arguments"] = self.arguments
        return data

    @classmethod
    def parse(cls, raw: object, *, where: str) -> CallVerdict:
        """A stored verdict; ``Unreadable`` when malformed."""
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise Unreadable(f"{where} has no call id")
        verdict = raw.get("verdict")
        if verdict not in VERDICTS:
            raise Unreadable(f"{where} has an unknown verdict")
        reason = raw.get("reason", "")
        if not isinstance(reason, str):
            raise Unreadable(f"{where} has a reason that is not text")
        return cls(
            call_id=raw["id"],
            verdict=verdict,
            reason=reason,
            answer=raw.get("answer") if verdict == ANSWER else None,
            arguments=raw.get("arguments") if verdict == EDIT else None,
        )


def answer_chars(answer: Any) -> int:
    """How long an answer counts as: text as it is, anything else as its canonical JSON."""
    return len(answer) if isinstance(answer, str) else len(canonical_json(answer))


def parse_verdicts(raw: object, *, where: str) -> tuple[CallVerdict, ...]:
    """Stored verdicts (``None``: none); ``Unreadable`` when malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Unreadable(f"{where} is not a list")
    return tuple(CallVerdict.parse(item, where=f"{where} {i + 1}") for i, item in enumerate(raw))


def by_call(verdicts: Iterable[CallVerdict]) -> dict[str, CallVerdict]:
    return {verdict.call_id: verdict for verdict in verdicts}
