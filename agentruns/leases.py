"""The values a segment and the transitions pass each other: a lease, an event to append, a
decision that took effect.

Interfaces (the playground's stream, the inbox, tests) import these without importing the writer
(``agentruns.transitions``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from agentruns.models import AgentRun, AgentRunEvent


@dataclass
class Lease:
    """A segment's hold on a run: the identity and fencing token every guarded write carries.

    ``next_sequence`` is the segment's event counter and ``head`` the hash of the run's last
    event (``agentruns.ledger``). While the lease is held nobody else appends events (decisions
    need a waiting run, the reaper a stale one), so both stay exact. ``head`` ``None``: not
    known yet; the next write with events reads it from the row.
    """

    run_id: int
    uuid: UUID
    owner: str
    epoch: int
    next_sequence: int
    head: str | None = None


@dataclass
class EventSpec:
    """An event to append in the same transaction as a state change."""

    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    duration_ms: int | None = None
    actor_id: int | None = None
    # For observers only (a live trace): what the event stands for beyond what is stored, e.g.
    # a request's whole dialogue. Never written.
    shown: dict[str, Any] | None = None


@dataclass
class Decided:
    """A decision that took effect: the run after it, and the lease when continued inline."""

    run: AgentRun
    lease: Lease | None
    # The decision's event as written (for an observer: a live trace shows who decided).
    event: EventSpec | None = None
    # Every event of the run, the decision's included, when the decision read them under the
    # row lock (inline, on PostgreSQL), in sequence order; ``None``: the continuation reads them.
    events: list[AgentRunEvent] | None = None


@dataclass
class Claimed:
    """A claim of a queued run that took effect (``run_claim_queued_row``)."""

    lease: Lease
    # The row as the claim left it, with its configuration (read by the same statement).
    run: AgentRun
    # Every event of the run, when the claim knows them all (its first claim: its own), in
    # sequence order; ``None``: read them.
    events: list[AgentRunEvent] | None = None
