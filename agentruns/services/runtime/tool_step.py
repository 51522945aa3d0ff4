"""One tool call of a segment: the fence hook and the call itself (docs/design.md §4); which tools
a run may use is ``agentruns.tools.gate``.

``before_tool`` is the fence hook, installed on every path that executes a tool: a write needs a
lease on a persisted run (``WriteWithoutDurableExecution`` otherwise, before the tool body can
run) and is stamped on the run row first. ``execute_tool_call`` runs one call behind it and
answers with a plain ``ToolStep``: whether it ran, its result, and whether the lease was lost.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from agentruns import tracing, transitions
from agentruns.conf import app_settings
from agentruns.exceptions import WriteWithoutDurableExecution
from agentruns.leases import EventSpec, Lease
from agentruns.models import WRITE_EFFECTS, Effect, EventKind
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.transcript import ANSWERED, EXPIRED_MESSAGE, denied_message
from agentruns.tools import Tool, ToolContext, ToolResult, invoke_tool
from agentruns.turns import DEADLINE, Call

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
    ``checked``: the arguments were just accepted for this tool (``invoke_tool``). Traced as
    one span (``tracing.tool_call``).
    """
    effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
    with tracing.tool_call(
        name=name,
        call_id=call_id,
        effect=str(effect),
        idempotency_key=f"{run_uuid}:{call_id}",
        arguments=arguments,
    ) as span:
        step = _execute_tool_call(
            tool,
            effect,
            name,
            call_id,
            arguments,
            lease,
            initiator_id,
            run_uuid,
            loop_state,
            checked,
        )
        _traced_outcome(span, step, effect=str(effect))
    return step


def _traced_outcome(span: tracing.Traced, step: ToolStep, *, effect: str) -> None:
    """What the tool call's span records of how it ended."""
    if not span.recording:
        return
    result = step.result
    if result is None:
        outcome = "interrupted" if step.interrupted else "not_started"
    else:
        outcome = "in_doubt" if result.in_doubt else "refused" if result.refused else "executed"
    fenced = effect in WRITE_EFFECTS and result is not None
    ok = None if result is None else result.ok
    tracing.tool_outcome(
        span,
        outcome=outcome,
        fenced=fenced,
        ok=ok,
        result=None if result is None else result.content,
    )


def _execute_tool_call(
    tool: Tool | None,
    effect: str,
    name: str,
    call_id: str,
    arguments: Any,
    lease: Lease | None,
    initiator_id: int | None,
    run_uuid: UUID,
    loop_state: Mapping[str, Any] | None,
    checked: bool,
) -> ToolStep:
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


def denied_event(call: Call, *, by: str = "", decider: str = "", reason: str = "") -> EventSpec:
    """A call that was denied: the model is told who denied it (``decider``, a username; an
    operator when not known) and, verbatim and marked as the reviewer's words, their
    ``reason`` (``transcript.tool_message_content``) — or, ``by="deadline"``, that the request
    expired (docs/design.md §5.11)."""
    if by == DEADLINE:
        return unrun_event(call, outcome="expired", error=EXPIRED_MESSAGE)
    event = unrun_event(call, outcome="denied", error=denied_message(decider))
    if decider:
        event.payload["decided_by"] = decider
    if reason:
        event.payload["reason"] = reason
    return event


def answered_event(call: Call, *, decider: str, answer: Any) -> EventSpec:
    """A call a person answered in place of running it: the tool did not run and nothing was
    fenced; the model reads ``answer`` as the call's result, marked as given by that person
    (``transcript.tool_message_content``)."""
    return EventSpec(
        EventKind.TOOL,
        {
            "call_id": call.id,
            "name": call.name,
            "effect": call.effect or None,
            "outcome": ANSWERED,
            "ok": True,
            "result": answer,
            "decided_by": decider,
        },
        shown={"arguments": call.arguments},
    )


def edited_marks(call: Call) -> dict[str, Any]:
    """What a ``tool`` event of ``call`` adds when a person edited its arguments: the edited
    arguments (not the proposed ones the ``llm`` event stores) and the edit — who edited and
    the model's original arguments. ``{}`` for a call nobody edited."""
    if call.edit is None:
        return {}
    return {
        "arguments": call.arguments,
        "edit": {
            "editor": call.edit.editor,
            "editor_id": call.edit.editor_id,
            "original_arguments": call.edit.original_arguments,
        },
    }


def refused_event(call: Call, reason: str) -> EventSpec:
    """A call whose arguments break its tool's schema, refused when the model proposed it (no
    person is asked to approve it); the model reads why."""
    return unrun_event(call, outcome="invalid_arguments", error=reason)
