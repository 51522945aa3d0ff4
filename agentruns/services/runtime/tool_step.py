"""One tool call of a segment: which tools a run may use, the fence hook, and the call itself
(docs/design.md §4).

``before_tool`` is the fence hook, installed on every path that executes a tool: a write needs a
lease on a persisted run (``WriteWithoutDurableExecution`` otherwise, before the tool body can
run) and is stamped on the run row first. ``execute_tool_call`` runs one call behind it and
answers with a plain ``ToolStep``: whether it ran, its result, and whether the lease was lost.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from agentruns import transitions
from agentruns.conf import app_settings
from agentruns.exceptions import WriteWithoutDurableExecution
from agentruns.leases import EventSpec, Lease
from agentruns.models import WRITE_EFFECTS, AgentConfiguration, Effect, EventKind
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.transcript import DENIED_MESSAGE, EXPIRED_MESSAGE
from agentruns.tools import Tool, ToolContext, ToolResult, invoke_tool, registry
from agentruns.turns import DEADLINE, Call

# --- Which tools a run may use ------------------------------------------------------------------


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

    def shown(self, call: Call) -> Call:
        """``call`` as an approver is shown it: its effect, whether it needs a decision, whether
        its tool is known, where it comes from and the tool's hints."""
        tool = self.available(call.name)
        return Call(
            id=call.id,
            name=call.name,
            arguments=call.arguments,
            effect=call.effect or self.effect(call.name),
            needs_approval=tool is None or tool.needs_approval,
            known=tool is not None,
            source=tool.source if tool is not None else "unknown",
            hints=dict(tool.hints) if tool is not None else {},
            detailed=True,
            preview=call.preview,
        )


# --- The fence hook and the call ----------------------------------------------------------------


def before_tool(
    *,
    effect: str,
    lease: Lease | None,
    call: Call,
    loop_state: Mapping[str, Any] | None = None,
) -> bool:
    """The before-tool hook. Whether the tool may run: reads always; a write once its fence is
    stamped on the row (saving ``loop_state`` with it when given). ``False``: the stamp matched
    no row — the lease is lost and the write must not start.

    Raises ``WriteWithoutDurableExecution`` for a write without a lease on a persisted run.
    """
    if effect not in WRITE_EFFECTS:
        return True
    if lease is None or not lease.run_id:
        raise WriteWithoutDurableExecution(
            f"{call.name!r} is a {effect} and this segment holds no lease on a persisted run"
        )
    return transitions.run_stamp_fence(
        lease, effect=effect, call=call.to_json(), loop_state=loop_state
    )


@dataclass(frozen=True)
class ToolStep:
    """What one call came to. ``result`` is ``None`` when the fence stamp matched no row (the
    tool did not run) or when the read was interrupted because the worker is stopping
    (``interrupted``: it changed nothing, and runs again in the next segment); ``lease_lost``
    when the stamp matched no row or the ticker's renewal failed while the tool ran (it ran: its
    result must be recorded if the run was cancelled)."""

    result: ToolResult | None
    duration_ms: int = 0
    lease_lost: bool = False
    interrupted: bool = False

    @property
    def ran(self) -> bool:
        return self.result is not None


def execute_tool_call(
    *,
    tool: Tool | None,
    name: str,
    call_id: str,
    arguments: Any,
    lease: Lease | None,
    initiator_id: int | None,
    run_uuid: UUID,
    loop_state: Mapping[str, Any] | None = None,
    checked: bool = False,
) -> ToolStep:
    """Run one tool call behind the fence hook (an unknown tool is a refused write).

    Raises ``WriteWithoutDurableExecution`` (no lease, write effect) before the body runs.
    ``checked``: the arguments were just accepted for this tool (``invoke_tool``).
    """
    effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
    call = Call(id=call_id, name=name, arguments=arguments, effect=str(effect))
    if not before_tool(effect=effect, lease=lease, call=call, loop_state=loop_state):
        return ToolStep(result=None, lease_lost=True)
    context = ToolContext(
        run_uuid=run_uuid,
        call_id=call_id,
        initiator_id=initiator_id,
        fencing_token=lease.epoch if lease else 0,
        timeout_seconds=app_settings().tool_timeout_seconds,
    )
    started = time.monotonic()
    lost = False
    if tool is None:
        result = ToolResult(ok=False, content=None, error=f"unknown tool {name!r}")
    elif lease is None:
        result = invoke_tool(tool, arguments, context, checked=checked)
    elif effect == Effect.READ:
        # A read may be cut off by a stopping worker (``shutdown``); a write never is.
        with LeaseTicker(lease) as ticker:
            try:
                with shutdown.interruptible():
                    result = invoke_tool(tool, arguments, context, checked=checked)
            except shutdown.StopRequested:
                return ToolStep(None, int((time.monotonic() - started) * 1000), interrupted=True)
        lost = ticker.lost
    else:
        with LeaseTicker(lease) as ticker:
            result = invoke_tool(tool, arguments, context, checked=checked)
        lost = ticker.lost
    return ToolStep(result, int((time.monotonic() - started) * 1000), lost)


def unrun_event(call: Call, *, outcome: str, error: str) -> EventSpec:
    """The ``tool`` event of a call that did not run (``outcome`` says why): the model reads
    ``error`` as the call's result. Its arguments are the proposed ones, which the ``llm``
    event stores."""
    return EventSpec(
        EventKind.TOOL,
        {
            "call_id": call.id,
            "name": call.name,
            "effect": call.effect or None,
            "outcome": outcome,
            "ok": False,
            "error": error,
        },
        shown={"arguments": call.arguments},
    )


def denied_event(call: Call, *, by: str = "") -> EventSpec:
    """A call that was denied: the model is told an operator denied it — or, ``by="deadline"``,
    that the request expired (docs/design.md §5.11)."""
    if by == DEADLINE:
        return unrun_event(call, outcome="expired", error=EXPIRED_MESSAGE)
    return unrun_event(call, outcome="denied", error=DENIED_MESSAGE)


def refused_event(call: Call, reason: str) -> EventSpec:
    """A call whose arguments break its tool's schema, refused when the model proposed it (no
    person is asked to approve it); the model reads why."""
    return unrun_event(call, outcome="invalid_arguments", error=reason)
