"""Where a tool's automatic check of an in-doubt write stands (``pending_turn["check"]``), as the
card and the API show it while the run waits for reconciliation (docs/design.md §9.2).

Not covered by the turn's digest: it says what the check did, never what a decision applies to.
A malformed record reads as no check at all (the turn itself stays decidable by a person).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

#: A check is queued and has not started.
SCHEDULED = "scheduled"
#: A check is asking the downstream system now.
CHECKING = "checking"
#: The last check could not tell (unknown, an error, a timeout); another one is due at ``next_at``.
RETRYING = "retrying"
#: No more checks: the last answer stands on the card and a person decides.
LEFT_TO_PERSON = "left_to_person"
CHECK_STATES = (SCHEDULED, CHECKING, RETRYING, LEFT_TO_PERSON)

#: The answers that do not settle anything.
UNKNOWN = "unknown"
ERROR = "error"
TIMEOUT = "timeout"
#: A verdict the run could not take (its configuration was deactivated meanwhile).
REFUSED = "refused"


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse_when(raw: Any) -> datetime | None:
    return parse_datetime(raw) if isinstance(raw, str) else None


@dataclass(frozen=True)
class CheckStatus:
    """``attempts`` checks of ``limit`` have started; ``answer`` and ``evidence`` are the last
    one's (``""`` before any), given at ``answered_at``; ``next_at`` when another is due."""

    state: str
    attempts: int = 0
    limit: int = 0
    answer: str = ""
    evidence: str = ""
    started_at: datetime | None = None
    answered_at: datetime | None = None
    next_at: datetime | None = None

    @classmethod
    def scheduled(cls, limit: int) -> CheckStatus:
        return cls(state=SCHEDULED, limit=limit)

    def started(self, *, attempt: int, at: datetime) -> CheckStatus:
        return replace(self, state=CHECKING, attempts=attempt, started_at=at, next_at=None)

    def answered(
        self, *, answer: str, evidence: str, at: datetime, next_at: datetime | None
    ) -> CheckStatus:
        return replace(
            self,
            state=RETRYING if next_at is not None else LEFT_TO_PERSON,
            answer=answer,
            evidence=evidence,
            answered_at=at,
            next_at=next_at,
        )

    @property
    def running(self) -> bool:
        return self.state in (SCHEDULED, CHECKING, RETRYING)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "attempts": self.attempts,
            "limit": self.limit,
            "answer": self.answer,
            "evidence": self.evidence,
            "started_at": _when(self.started_at),
            "answered_at": _when(self.answered_at),
            "next_at": _when(self.next_at),
        }

    @classmethod
    def parse(cls, raw: object) -> CheckStatus | None:
        """The stored record, or ``None`` when there is none or it is malformed."""
        if not isinstance(raw, dict) or raw.get("state") not in CHECK_STATES:
            return None
        attempts, limit = raw.get("attempts"), raw.get("limit")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (attempts, limit)):
            return None
        return cls(
            state=str(raw["state"]),
            attempts=int(attempts),  # type: ignore[arg-type]
            limit=int(limit),  # type: ignore[arg-type]
            answer=str(raw.get("answer") or ""),
            evidence=str(raw.get("evidence") or ""),
            started_at=_parse_when(raw.get("started_at")),
            answered_at=_parse_when(raw.get("answered_at")),
            next_at=_parse_when(raw.get("next_at")),
        )
