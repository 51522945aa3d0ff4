"""What a segment knows and changes (``SegmentState``) and what it works with (``Segment``),
as plain values (docs/design.md §6.1).

A segment makes one ``SegmentState`` and hands it to each of its steps with its ``Segment`` and
its boundary writer (``boundaries.Boundaries``); a step advances the state it is given and returns
it, or returns a ``Stop`` (the segment is over). Nothing else of a segment changes between its
steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentruns import budgets
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentConfiguration, AgentRun
from agentruns.providers import Provider
from agentruns.services.runtime.results import RetryScheduler
from agentruns.services.runtime.transcript import message_for_event
from agentruns.tools.gate import ToolGate
from agentruns.turns import LoopState


@dataclass
class Unwritten:
    """What the segment's next write carries besides its own events.

    ``events``: completed steps deferred to it (the last call of a turn, which the boundary that
    always follows at once records; the answer proposing a turn that waits for a decision, which
    the suspend records). ``clear``: the effect of the write whose fence that boundary clears
    (``""``: none). ``charge``: an answer's cost, charged to the spend ledger in the transaction
    of the write that records the answer (``budgets.charge``).
    """

    events: list[EventSpec] = field(default_factory=list)
    clear: str = ""
    charge: budgets.Charge | None = None

    def defer(self, events: list[EventSpec], *, clear: str = "") -> None:
        """Carry ``events`` (and, with ``clear``, their write's fence clear) with the next write."""
        self.events.extend(events)
        self.clear = clear or self.clear

    def take(self) -> tuple[list[EventSpec], str]:
        """The deferred events and fence clear, handed to the write that carries them."""
        events, clear = self.events, self.clear
        self.events, self.clear = [], ""
        return events, clear


@dataclass(frozen=True)
class Sent:
    """What the segment's last recorded request sent beyond the dialogue: the system prompt and
    the names of the tools offered (a request records them when they change)."""

    system: Any
    tools: list[str]


@dataclass
class SegmentState:
    """A segment's state: ``loop`` (saved with every boundary), the dialogue as the provider is
    sent it (``messages``), what the next write carries (``unwritten``) and what the last
    ``request`` recorded (``sent``; ``None`` before the segment's first)."""

    loop: LoopState = field(default_factory=LoopState)
    messages: list[dict[str, Any]] = field(default_factory=list)
    unwritten: Unwritten = field(default_factory=Unwritten)
    sent: Sent | None = None

    def remember(self, spec: EventSpec) -> None:
        """Add ``spec`` to the dialogue, when the model reads it (``transcript``)."""
        message = message_for_event(spec.kind, spec.payload)
        if message is not None:
            self.messages.append(message)

    def cost_to_record(self) -> Any:
        """The run's cost for a write to store: when an answer's charge rides on it, else
        ``None`` (the column is left as it is)."""
        return self.loop.usage.cost if self.unwritten.charge is not None else None


@dataclass(frozen=True)
class Finished:
    """The model's final answer, to settle: ``output``, its ``llm`` event (``None``: recorded
    already, by a segment that did not settle it) and whether the round cap cut the run short."""

    output: str
    answered: EventSpec | None
    truncated: bool


@dataclass(frozen=True)
class Segment:
    """What a segment works with: the ``lease`` it holds, the ``run`` and its ``config`` and
    ``request`` as it read them (identity over snapshot: read once per segment), the tools it
    may use (``gate``), its provider (built for its first call), the ``rounds`` the run may
    take (``max_iterations``: then one final call offered no tools) and, on a worker,
    ``retry`` (schedules the delayed wake-up of a run requeued after a retryable provider
    failure)."""

    lease: Lease
    run: AgentRun
    config: AgentConfiguration
    request: dict[str, Any]
    gate: ToolGate
    provider: Callable[[], Provider]
    rounds: int
    retry: RetryScheduler | None = None
