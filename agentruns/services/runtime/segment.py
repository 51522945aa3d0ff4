"""The agent loop: one segment of a run, from its last step boundary to a pause or an end.

A segment holds a ``Lease``. Every step boundary is one owner-guarded write that renews the
lease, saves the loop state and appends the step's events; a write that matches no row means
the lease is lost (or the run was cancelled) and the segment stops at once: no settle, no
event, no further provider or tool call (RUNS.md §4). Before a write tool runs, the fence hook
stamps its effect on the row; the boundary after it clears the stamp (RUNS.md §5).

The loop, per round: the approval scan before any call of a turn executes (RUNS.md §6); then
the calls in order, each a boundary; then the next provider call. ``max_iterations`` rounds end
with one final call offered no tools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentruns import conf, transitions
from agentruns.exceptions import StateWriteFailed, WriteWithoutDurableExecution
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    WRITE_EFFECTS,
    AgentConfiguration,
    AgentRun,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.providers.base import ProviderError, ProviderReply, ToolCall, provider_for
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.transcript import (
    DENIED_MESSAGE,
    NotRehydratable,
    message_for_event,
    rehydrate,
)
from agentruns.tools import Tool, ToolContext, ToolResult, invoke_tool, registry
from agentruns.tools.registry import overlay_input
from agentruns.turns import Call, PendingTurn

logger = logging.getLogger(__name__)

EventObserver = Callable[[EventSpec], None]
RetryScheduler = Callable[[AgentRun, float], None]


class Outcome:
    """What a segment tells its caller (RUNS.md §10)."""

    COMPLETED = "completed"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_INPUT = "awaiting_input"
    AWAITING_RECONCILIATION = "awaiting_reconciliation"
    SUSPEND_FAILED = "suspend_failed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    LEASE_LOST = "lease_lost"
    # Not a segment's outcome: a decision was recorded and handed to a worker.
    QUEUED = "queued"


@dataclass
class SegmentResult:
    outcome: str
    run: AgentRun
    detail: dict[str, Any] = field(default_factory=dict)


class _Stop(Exception):
    """Unwinds the loop with an outcome; raised only at a step boundary."""

    def __init__(self, outcome: str, **detail: Any) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.detail = detail


# --- The fence hook ----------------------------------------------------------------------------


def before_tool(
    *,
    effect: str,
    lease: Lease | None,
    call: dict[str, Any],
    loop_state: dict[str, Any] | None = None,
) -> None:
    """The before-tool hook, installed on every path that executes a tool.

    A write effect needs a persisted, leased run: without one it raises
    ``WriteWithoutDurableExecution`` before the tool body can run. With one it stamps the fence
    (saving ``loop_state`` with it when given); a stamp that matches no row means the lease is
    lost and the write does not start. Reads cost nothing.
    """
    if effect not in WRITE_EFFECTS:
        return
    if lease is None or not lease.run_id:
        raise WriteWithoutDurableExecution(
            f"{call.get('name')!r} is a {effect} and this segment holds no lease on a persisted run"
        )
    if not transitions.run_stamp_fence(lease, effect=effect, call=call, loop_state=loop_state):
        raise _Stop(Outcome.LEASE_LOST, at="fence")


def execute_tool_call(
    *,
    tool: Tool | None,
    name: str,
    call_id: str,
    arguments: Any,
    lease: Lease | None,
    initiator_id: int | None,
    run_uuid: Any,
    loop_state: dict[str, Any] | None = None,
) -> tuple[ToolResult, int, bool]:
    """Run one tool call behind the fence hook. Returns the result, its duration and whether
    the lease was lost while it ran (the ticker's verdict).

    Raises ``WriteWithoutDurableExecution`` (no lease, write effect) before the body runs.
    """
    effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
    call = {"id": call_id, "name": name, "arguments": arguments, "effect": str(effect)}
    before_tool(effect=effect, lease=lease, call=call, loop_state=loop_state)
    context = ToolContext(
        run_uuid=run_uuid,
        call_id=call_id,
        initiator_id=initiator_id,
        fencing_token=lease.epoch if lease else 0,
        timeout_seconds=float(conf.get("TOOL_TIMEOUT_SECONDS")),
    )
    started = time.monotonic()
    lost = False
    if tool is None:
        result = ToolResult(ok=False, content=None, error=f"unknown tool {name!r}")
    elif lease is None:
        result = invoke_tool(tool, arguments, context)
    else:
        with LeaseTicker(lease) as ticker:
            result = invoke_tool(tool, arguments, context)
        lost = ticker.lost
    return result, int((time.monotonic() - started) * 1000), lost


# --- The segment -------------------------------------------------------------------------------


class RunSegment:
    """One stretch of execution of a run under ``lease``.

    ``retry`` (workers only) schedules a delayed wake-up after a retryable failure was requeued;
    without it failures settle the run. ``observer`` sees every event once its boundary committed.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        retry: RetryScheduler | None = None,
        observer: EventObserver | None = None,
    ) -> None:
        self.lease = lease
        self.retry = retry
        self.observer = observer
        self.run: AgentRun = AgentRun.objects.select_related("configuration").get(pk=lease.run_id)
        # Identity over snapshot: the configuration is re-read on every segment.
        self.config: AgentConfiguration = self.run.configuration
        self.request: dict[str, Any] = (
            self.run.request if isinstance(self.run.request, dict) else {}
        )
        self.state: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        # The completed last call of a turn, recorded by the boundary that always follows it at
        # once (the request before the next provider call): one write instead of two.
        self._deferred: list[EventSpec] = []
        self._deferred_clear = False

    # -- boundaries --

    def _boundary(self, events: list[EventSpec], *, clear_fence: bool = False) -> None:
        deferred, self._deferred = self._deferred, []
        clear_fence = clear_fence or self._deferred_clear
        self._deferred_clear = False
        written = [*deferred, *events]
        write = transitions.run_clear_fence if clear_fence else transitions.run_heartbeat
        if not write(self.lease, loop_state=self.state, events=written):
            self._stop_lost(completed=written)
        for spec in events:  # the deferred ones joined the dialogue when they were deferred
            self._remember(spec)
        if self.observer is not None:
            for spec in written:
                self.observer(spec)

    def _step_done(self, events: list[EventSpec], *, clear_fence: bool, last_of_turn: bool) -> None:
        """Record a completed tool step: at once, or, for the last call of a turn, with the next
        boundary. Nothing with a side effect happens in between (the loop goes straight to the
        ``request`` boundary), so a crash there loses exactly what a crash inside the call
        would: the call is executed again (or, fenced non-idempotent, reconciled)."""
        if not last_of_turn:
            self._boundary(events, clear_fence=clear_fence)
            return
        self._deferred.extend(events)
        self._deferred_clear = self._deferred_clear or clear_fence
        for spec in events:
            self._remember(spec)

    def _flush(self) -> None:
        """Write deferred steps before a write that does not carry them (suspend, settle)."""
        if self._deferred:
            self._boundary([])

    def _remember(self, spec: EventSpec) -> None:
        message = message_for_event(spec.kind, spec.payload)
        if message is not None:
            self.messages.append(message)

    def _stop_lost(self, *, completed: list[EventSpec] | None = None, **detail: Any) -> None:
        """A guarded write matched nothing: the run was cancelled under us, or the lease lost.

        Every path that learns of a lost lease (a boundary, the ticker, the fence stamp) comes
        here, so a cancel is always recognised and recorded as one. On a cancel the steps that
        completed (a tool call that ran, a model answer) are recorded before the cancel event,
        so a write that happened is never missing from the audit; a lost lease records nothing.
        """
        finished = [
            spec
            for spec in [*self._deferred, *(completed or [])]
            if spec.kind in (EventKind.TOOL, EventKind.LLM)
        ]
        self._deferred = []
        noticed = transitions.run_notice_cancel(
            self.lease,
            events=[
                *finished,
                EventSpec(EventKind.CANCEL, {"note": "noticed at step boundary"}),
            ],
        )
        raise _Stop(Outcome.CANCELLED if noticed else Outcome.LEASE_LOST, **detail)

    def _event(self, kind: str, payload: dict[str, Any], **extra: Any) -> EventSpec:
        return EventSpec(kind, payload, **extra)

    # -- entry point --

    def execute(self) -> SegmentResult:
        try:
            try:
                rehydrated = rehydrate(self.run)
            except NotRehydratable as exc:
                self._settle(
                    Status.FAILED,
                    TerminationReason.NOT_RESUMABLE,
                    error={"type": "NotRehydratable", "message": str(exc)},
                )
                raise _Stop(Outcome.FAILED, reason=TerminationReason.NOT_RESUMABLE) from exc
            self.state = rehydrated.loop_state
            self.messages = rehydrated.messages
            self.lease.next_sequence = max(self.lease.next_sequence, rehydrated.next_sequence)
            self._loop()
        except _Stop as stop:
            return SegmentResult(stop.outcome, self._reload(), stop.detail)
        except StateWriteFailed as exc:
            # The database refused a state write. The lease runs out and the reaper settles or
            # resumes the run from its last boundary; nothing half-written is announced.
            logger.error("run %s: state write failed: %s", self.lease.uuid, exc)
            return SegmentResult(Outcome.FAILED, self._reload(), {"error": exc.code})
        raise AssertionError("the loop ends only by _Stop")  # pragma: no cover

    def _reload(self) -> AgentRun:
        return AgentRun.objects.select_related("configuration", "initiator").get(
            pk=self.lease.run_id
        )

    # -- the loop --

    def _loop(self) -> None:
        decision_events = self._apply_decision()
        if decision_events:
            self._boundary(decision_events)
        # Otherwise no boundary here: the claim that started this segment just renewed the
        # lease, and the next step's boundary or fence stamp saves the state (with the decision
        # applied) and notices a cancel. Should the segment die before that, only reads can
        # have run, and the next segment re-applies the stored decision (idempotent).
        cap = self._round_cap()
        while True:
            if self.state.get("turn"):
                self._run_turn()
                self.state["turn"] = None
                continue
            if self.state.get("iteration", 0) >= cap:
                reply = self._call_provider(final=True)
                self._settle_completed(reply, truncated=True)
            reply = self._call_provider(final=False)
            if not reply.tool_calls:
                self._settle_completed(reply, truncated=False)
            # Otherwise the turn was saved with the llm event; the next pass executes it.

    def _round_cap(self) -> int:
        limit = int(conf.get("MAX_ITERATIONS"))
        requested = self.request.get("max_iterations")
        configured = self.config.max_iterations
        cap = requested if isinstance(requested, int) and requested > 0 else configured
        return max(1, min(int(cap), limit))

    # -- decisions recorded by a human while the run waited --

    def _apply_decision(self) -> list[EventSpec]:
        decision = self.state.pop("decision", None)
        if not decision:
            return []
        turn = self.state.get("turn") or {}
        kind = decision.get("kind")
        if kind == "approval":
            turn["approved"] = bool(decision.get("approved"))
            return []
        if kind == "input":
            turn.setdefault("inputs", {})[decision["call_id"]] = decision.get("values", {})
            return []
        if kind == "reconciliation":
            call = decision.get("call") or {}
            landed = decision.get("verdict") == "landed"
            content = {
                "reconciled": True,
                "landed": landed,
                "message": (
                    "an operator confirmed this call took effect"
                    if landed
                    else "an operator confirmed this call did NOT take effect"
                ),
            }
            turn.setdefault("done", []).append(call.get("id"))
            return [
                self._event(
                    EventKind.TOOL,
                    {
                        "call_id": call.get("id"),
                        "name": call.get("name"),
                        "arguments": call.get("arguments", {}),
                        "effect": call.get("effect", Effect.NON_IDEMPOTENT_WRITE),
                        "outcome": "reconciled_landed" if landed else "reconciled_not_landed",
                        "ok": landed,
                        "result": content,
                        "content": ToolResult(ok=True, content=content).as_message_content(),
                    },
                )
            ]
        raise _Stop(Outcome.FAILED, error=f"unknown decision kind {kind!r}")

    # -- tools --

    def _available_tool(self, name: str) -> Tool | None:
        allowed = self.config.tools or None
        narrowed = self.request.get("tools") or None
        if allowed is not None and name not in allowed:
            return None
        if narrowed is not None and name not in narrowed:
            return None
        return registry.get(name)

    def _effect(self, name: str) -> str:
        tool = self._available_tool(name)
        return str(tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE)

    def _needs_approval(self, name: str) -> bool:
        tool = self._available_tool(name)
        return True if tool is None else tool.needs_approval

    def _offered_tools(self) -> list[dict[str, Any]]:
        names = self.config.tools or [t.name for t in registry.all()]
        narrowed = self.request.get("tools") or None
        offered = []
        for name in names:
            if narrowed is not None and name not in narrowed:
                continue
            tool = registry.get(name)
            if tool is not None:
                offered.append(tool.openai_schema())
        return offered

    def _run_turn(self) -> None:
        turn = self.state["turn"]
        calls = turn["calls"]
        if turn.get("approved") is None and any(self._needs_approval(c["name"]) for c in calls):
            self._suspend_for_approval(calls)
        for index, call in enumerate(calls):
            last_of_turn = index == len(calls) - 1
            if call["id"] in turn.get("done", []):
                continue
            tool = self._available_tool(call["name"])
            needs_approval = tool is None or tool.needs_approval
            if turn.get("approved") is False or (
                needs_approval and turn.get("approved") is not True
            ):
                # Denied: nothing of the turn executes. And fail closed: a call that needs a
                # decision runs only after an approval.
                self._record_denied(call, last_of_turn=last_of_turn)
                continue
            arguments = call.get("arguments", {})
            if tool is not None and tool.input_schema is not None:
                values = turn.get("inputs", {}).get(call["id"])
                if values is None:
                    self._suspend_for_input(call, tool)
                arguments = overlay_input(tool, arguments, values)
            self._execute(call, tool, arguments, last_of_turn=last_of_turn)

    def _record_denied(self, call: dict[str, Any], *, last_of_turn: bool = False) -> None:
        self.state["turn"]["done"].append(call["id"])
        content = ToolResult(ok=False, content=None, error=DENIED_MESSAGE).as_message_content()
        self._step_done(
            [
                self._event(
                    EventKind.TOOL,
                    {
                        "call_id": call["id"],
                        "name": call["name"],
                        "arguments": call.get("arguments", {}),
                        "effect": call.get("effect"),
                        "outcome": "denied",
                        "ok": False,
                        "error": DENIED_MESSAGE,
                        "content": content,
                    },
                )
            ],
            clear_fence=False,
            last_of_turn=last_of_turn,
        )

    def _execute(
        self,
        call: dict[str, Any],
        tool: Tool | None,
        arguments: Any,
        *,
        last_of_turn: bool = False,
    ) -> None:
        effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
        try:
            result, duration_ms, lost = execute_tool_call(
                tool=tool,
                name=call["name"],
                call_id=call["id"],
                arguments=arguments,
                lease=self.lease,
                initiator_id=self.run.initiator_id,
                run_uuid=self.run.uuid,
                # The stamp also saves the state: a decision applied by this segment is durable
                # before the write starts (a reconciliation must find the turn approved).
                loop_state=self.state,
            )
        except _Stop as stop:
            if stop.outcome == Outcome.LEASE_LOST:  # the fence stamp matched no row
                self._stop_lost(**stop.detail)
            raise
        self.state["turn"]["done"].append(call["id"])
        event = self._event(
            EventKind.TOOL,
            {
                "call_id": call["id"],
                "name": call["name"],
                "arguments": arguments,
                "effect": str(effect),
                "outcome": "executed",
                "ok": result.ok,
                "result": result.content,
                "error": result.error,
                "content": result.as_message_content(),
                "idempotency_key": f"{self.run.uuid}:{call['id']}",
            },
            duration_ms=duration_ms,
        )
        if lost:  # the ticker's renewal matched no row while the call ran
            self._stop_lost(at="tool", completed=[event])
        self._step_done([event], clear_fence=effect in WRITE_EFFECTS, last_of_turn=last_of_turn)

    # -- suspending --

    def _suspend(self, status: str, pending_turn: PendingTurn, outcome: str) -> None:
        self._flush()
        if not transitions.run_suspend(
            self.lease, status=status, pending_turn=pending_turn, loop_state=self.state
        ):
            # Cancelled (or lost) meanwhile: never announce a resumable pause.
            try:
                self._stop_lost()
            except _Stop as stop:
                if stop.outcome == Outcome.CANCELLED:
                    raise
                raise _Stop(Outcome.SUSPEND_FAILED) from None
        raise _Stop(outcome)

    def _suspend_for_approval(self, calls: list[dict[str, Any]]) -> None:
        shown = []
        for call in calls:
            tool = self._available_tool(call["name"])
            shown.append(
                Call(
                    id=call["id"],
                    name=call["name"],
                    arguments=call.get("arguments", {}),
                    effect=call.get("effect") or self._effect(call["name"]),
                    needs_approval=tool is None or tool.needs_approval,
                    known=tool is not None,
                    source=tool.source if tool is not None else "unknown",
                    hints=dict(tool.hints) if tool is not None else {},
                    detailed=True,
                )
            )
        pending = PendingTurn.for_approval(shown)
        self._suspend(Status.WAITING_FOR_APPROVAL, pending, Outcome.AWAITING_APPROVAL)

    def _suspend_for_input(self, call: dict[str, Any], tool: Tool) -> None:
        asking = Call(
            id=call["id"],
            name=call["name"],
            arguments=call.get("arguments", {}),
            effect=str(tool.effect),
        )
        pending = PendingTurn.for_input(asking, tool.input_schema or {})
        self._suspend(Status.WAITING_FOR_INPUT, pending, Outcome.AWAITING_INPUT)

    # -- the provider --

    def _call_provider(self, *, final: bool) -> ProviderReply:
        tools = [] if final else self._offered_tools()
        self._boundary(
            [
                self._event(
                    EventKind.REQUEST,
                    {
                        "iteration": self.state.get("iteration", 0),
                        "final": final,
                        "messages": list(self.messages),
                        "tools": [t["function"]["name"] for t in tools],
                    },
                )
            ]
        )
        provider = provider_for(self.config, self.request)
        started = time.monotonic()
        try:
            with LeaseTicker(self.lease) as ticker:
                reply = provider.complete(
                    messages=list(self.messages), tools=tools, run_uuid=str(self.run.uuid)
                )
        except ProviderError as exc:
            if ticker.lost:
                self._stop_lost(at="provider")
            self._provider_failed(exc)
        duration_ms = int((time.monotonic() - started) * 1000)
        self.state["iteration"] = self.state.get("iteration", 0) + 1
        usage = self.state.setdefault("usage", {"prompt_tokens": 0, "completion_tokens": 0})
        usage["prompt_tokens"] += int(reply.usage.get("prompt_tokens", 0) or 0)
        usage["completion_tokens"] += int(reply.usage.get("completion_tokens", 0) or 0)
        calls = [] if final else self._unique_ids(reply.tool_calls)
        if not final and calls:
            self.state["turn"] = {
                "calls": [
                    {
                        "id": c.id,
                        "name": c.name,
                        "arguments": c.arguments,
                        "effect": self._effect(c.name),
                    }
                    for c in calls
                ],
                "done": [],
                "approved": None,
                "inputs": {},
            }
        answered = self._event(
            EventKind.LLM,
            {
                "iteration": self.state["iteration"],
                "final": final,
                "content": reply.content,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                ],
                "usage": dict(reply.usage),
                "model": reply.model,
            },
            duration_ms=duration_ms,
        )
        if ticker.lost:  # the ticker's renewal matched no row while the model answered
            self._stop_lost(at="provider", completed=[answered])
        self._boundary([answered])
        return reply

    def _unique_ids(self, calls: list[ToolCall]) -> list[ToolCall]:
        """Call ids made unique within the run: they key idempotency and turn digests, and some
        OpenAI-compatible servers reuse ids such as ``call_0`` on every turn."""
        seen = {call["id"] for message in self.messages for call in message.get("tool_calls", [])}
        unique: list[ToolCall] = []
        for call in calls:
            call_id = call.id or f"call_{self.state.get('iteration', 0)}_{len(unique)}"
            while call_id in seen:
                call_id = f"{call_id}~{self.state.get('iteration', 0)}"
            seen.add(call_id)
            unique.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
        return unique

    def _provider_failed(self, exc: ProviderError) -> None:
        error = {"type": f"ProviderError:{exc.kind}", "message": str(exc)[:500]}
        if self.retry is None:
            self._settle(Status.FAILED, TerminationReason.PROVIDER_FAILED, error=error)
            raise _Stop(Outcome.FAILED, reason=TerminationReason.PROVIDER_FAILED)
        if not exc.retryable:
            self._settle(Status.FAILED, TerminationReason.NOT_RETRYABLE, error=error)
            raise _Stop(Outcome.FAILED, reason=TerminationReason.NOT_RETRYABLE)
        if self.run.requeue_count >= int(conf.get("MAX_REQUEUES")):
            self._settle(Status.FAILED, TerminationReason.RETRIES_EXHAUSTED, error=error)
            raise _Stop(Outcome.FAILED, reason=TerminationReason.RETRIES_EXHAUSTED)
        delay = float(conf.get("RETRY_BACKOFF_SECONDS")) * (2**self.run.requeue_count)
        requeued = transitions.run_requeue(
            self.lease,
            error=error,
            events=[
                self._event(
                    EventKind.LEASE,
                    {"action": "requeued", "retry_in_seconds": delay, "error": error},
                )
            ],
        )
        if not requeued:
            self._stop_lost()
        self.retry(self.run, delay)
        raise _Stop(Outcome.REQUEUED, retry_in_seconds=delay)

    # -- endings --

    def _totals(self, *, truncated: bool) -> dict[str, Any]:
        usage = self.state.get("usage", {})
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        completion_tokens = int(usage.get("completion_tokens", 0))
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "iterations": int(self.state.get("iteration", 0)),
            "truncated": truncated,
            "loop_state": self.state,
        }

    def _settle(
        self, status: str, reason: str, *, output: str = "", error: dict | None = None
    ) -> None:
        self._flush()
        if not transitions.run_settle(
            run_id=self.lease.run_id,
            lease=self.lease,
            status=status,
            reason=reason,
            output=output,
            error=error,
            totals=self._totals(truncated=False),
        ):
            self._stop_lost()

    def _settle_completed(self, reply: ProviderReply, *, truncated: bool) -> None:
        self._flush()
        totals = self._totals(truncated=truncated)
        reason = TerminationReason.MAX_ITERATIONS if truncated else TerminationReason.COMPLETED
        if not transitions.run_settle(
            run_id=self.lease.run_id,
            lease=self.lease,
            status=Status.COMPLETED,
            reason=reason,
            output=reply.content or "",
            totals=totals,
        ):
            self._stop_lost()
        raise _Stop(Outcome.COMPLETED, reason=reason)


def continue_segment(
    lease: Lease,
    *,
    retry: RetryScheduler | None = None,
    observer: EventObserver | None = None,
) -> SegmentResult:
    """Run ``lease``'s run from its last step boundary until it pauses, ends or is lost."""
    return RunSegment(lease, retry=retry, observer=observer).execute()
