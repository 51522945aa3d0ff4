"""What a segment tells its caller, importable without the loop (docs/design.md §11.1).

Interfaces (the API, the inbox, the playground) read a ``SegmentResult``; the loop builds one from
the ``Stop`` its last step returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentruns.leases import Decided, EventSpec
from agentruns.models import AgentRun

#: Sees every event once the boundary that wrote it committed (the playground's stream).
EventObserver = Callable[[EventSpec], None]
#: Schedules a delayed wake-up of a run requeued after a retryable failure (workers only).
RetryScheduler = Callable[[AgentRun, float], None]
#: Sends a fresh wake-up for a run handed back by a stopping worker, as part of the transaction
#: that hands it back where the broker allows (workers only: ``dispatch.wake_with_commit``).
Waker = Callable[[str], None]


class Outcome:
    """How a segment ended."""

    COMPLETED = "completed"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    AWAITING_RECONCILIATION = "awaiting_reconciliation"
    SUSPEND_FAILED = "suspend_failed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    # The worker was told to stop: the run went back to the queue at a safe point.
    HANDED_BACK = "handed_back"
    LEASE_LOST = "lease_lost"
    # Not a segment's outcome: a decision was recorded and handed to a worker.
    QUEUED = "queued"
    # Not a final outcome: standing rules approved the turn, and a new segment continues it
    # (``Stop.continued``) in the same call of ``continue_segment``.
    APPROVED_BY_RULE = "approved_by_rule"


@dataclass
class SegmentResult:
    """A segment's outcome, the run as it is now, and details (the reason, a retry delay)."""

    outcome: str
    run: AgentRun
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stop:
    """A step's verdict that the segment is over: returned, never raised, up to the loop.
    ``run``: the row the segment's last write returned (a suspend's), its result without a read.
    ``continued``: standing rules approved the turn the segment suspended on, and claimed the
    run for the segment that continues it (``continue_segment`` runs it next)."""

    outcome: str
    detail: dict[str, Any] = field(default_factory=dict)
    run: AgentRun | None = None
    continued: Decided | None = None

    @classmethod
    def of(cls, outcome: str, **detail: Any) -> Stop:
        return cls(outcome, dict(detail))
