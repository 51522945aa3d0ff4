"""Which tools a run may use, and a call as a card shows it (docs/design.md §4.2, §5.3).

``ToolGate`` answers, for one run, which tool a name resolves to now: its configuration's list
(empty: every registered tool), narrowed by the run's request. ``ToolGate.shown`` is the one
place that says what a card shows about a call beside its id, name, arguments and preview: its
effect, whether it needs a decision, whether its tool is known, its source and hints, and where
its tool comes from (``agentruns.tools.origin_lookup``) — all read now, from what would
execute, never from a stored copy. The turn digest covers exactly that (``turns.Call.digested``).

Reads the registry (and, for a remote tool, its server row); writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentruns.models import Effect
from agentruns.tools.origin_lookup import tool_origin
from agentruns.tools.registry import Tool, registry
from agentruns.turns import Call

if TYPE_CHECKING:
    from agentruns.models import AgentConfiguration, AgentRun


@dataclass(frozen=True)
class ToolGate:
    """The tools a run may use: its configuration's list (empty: every registered tool), narrowed
    by the run's request. A tool outside the gate is treated as an unknown non-idempotent write
    that needs approval — it never runs unapproved."""

    allowed: tuple[str, ...] | None
    narrowed: tuple[str, ...] | None
    # What ``offered`` listed, kept for the gate's life (one segment): listing every tool reads
    # the enabled MCP servers, which would be a query per provider request.
    _offered: list[dict[str, Any]] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def for_run(cls, configuration: AgentConfiguration, request: Mapping[str, Any]) -> ToolGate:
        narrowed = request.get("tools") or None
        return cls(
            allowed=tuple(configuration.tools) if configuration.tools else None,
            narrowed=tuple(narrowed) if isinstance(narrowed, list) else None,
        )

    @classmethod
    def of(cls, run: AgentRun) -> ToolGate:
        """The gate of ``run``: the tools of the configuration version it pinned
        (``versions.pinned_configuration``, never the live row's), narrowed by its request."""
        from agentruns.versions import pinned_configuration

        configuration = pinned_configuration(run)
        return cls.for_run(configuration, run.request if isinstance(run.request, dict) else {})

    def available(self, name: str) -> Tool | None:
        if self.allowed is not None and name not in self.allowed:
            return None
        if self.narrowed is not None and name not in self.narrowed:
            return None
        return registry.get(name)

    def effect(self, name: str) -> str:
        tool = self.available(name)
        return str(tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE)

    def needs_approval(self, name: str) -> bool:
        tool = self.available(name)
        return True if tool is None else tool.needs_approval

    def input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.available(name)
        return tool.input_schema if tool is not None else None

    def offered(self) -> list[dict[str, Any]]:
        """The OpenAI-style schemas of the tools offered to the model, in configured order:
        listed once per gate (per segment), so a tool registered or a server enabled meanwhile
        is offered from the next segment on. Whether a call may run is never read from this
        list: ``available`` resolves the tool afresh for every call (a server disabled or an
        approval switch turned on counts at once: its call is unknown or waits for approval)."""
        if not self._offered:
            self._offered.extend(self._list_offered())
        return [dict(schema) for schema in self._offered]

    def _list_offered(self) -> list[dict[str, Any]]:
        names = self.allowed or tuple(t.name for t in registry.all())
        offered = []
        for name in names:
            if self.narrowed is not None and name not in self.narrowed:
                continue
            tool = registry.get(name)
            if tool is not None:
                offered.append(tool.openai_schema())
        return offered

    def shown(self, call: Call, *, effect: str = "") -> Call:
        """``call`` as a card shows it: its id, name, arguments and preview as given; its effect
        (the effect it would run with: the tool's, or a non-idempotent write when no tool of
        that name is available to the run), whether it needs a decision, whether its tool is
        known, its source and hints and its tool's origin — read now. ``effect``: the effect
        to show instead (an in-doubt call shows the effect its fence stamped)."""
        tool = self.available(call.name)
        return Call(
            id=call.id,
            name=call.name,
            arguments=call.arguments,
            effect=effect or str(tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE),
            needs_approval=tool is None or tool.needs_approval,
            known=tool is not None,
            source=tool.source if tool is not None else "unknown",
            hints=dict(tool.hints) if tool is not None else {},
            detailed=True,
            preview=call.preview,
            origin=tool_origin(call.name),
            edit=call.edit,
        )
