"""LangGraph under Leasehold's leases, fences, inbox and ledger (docs/external.md; the extra
``leasehold[langgraph]``).

The graph's checkpointer stays in charge of the graph's state; Leasehold of the effects:

* ``leasehold_tool(lc_tool, effect=…)`` declares a LangChain tool to Leasehold's registry with
  its effect, approve permission, preview and check; its body is the LangChain tool's.
* ``ToolNode()`` is the graph's tool node: it runs the last AI message's tool calls through the
  run (``Holding.run_turn``). A turn that needs a person raises ``interrupt()`` with the
  Leasehold card; a call recorded before (a replayed or forked thread, a resume) returns its
  recorded result and runs nothing.
* ``start(graph, …)`` opens the run and invokes the graph under its lease; ``resume(graph, run)``
  claims a run the inbox decided (or the reaper reclaimed) and continues the thread with
  ``Command(resume=…)`` when it is interrupted, else from its last checkpoint.

The decision binds, not the resume value: the value a graph is resumed with is informational
(the decision as Leasehold applied it); whether a call runs is Leasehold's to say.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import Command, interrupt

from agentruns import external
from agentruns.external.errors import LeaseLost, RunPaused
from agentruns.external.holding import PAUSED, Holding
from agentruns.external.values import Card, ProposedCall
from agentruns.models import AgentConfiguration, AgentRun, Effect
from agentruns.services._common import User
from agentruns.tools import Tool, ToolContext, registry, tool
from agentruns.tools.registry import CheckFunc, PreviewFunc

FRAMEWORK = "langgraph"
#: The graph config's ``configurable`` key naming the Leasehold run of a thread.
RUN_KEY = "leasehold_run"

_active_lock = threading.Lock()
_active: dict[str, Holding] = {}
_context: ContextVar[ToolContext | None] = ContextVar("leasehold_tool_context", default=None)


def call_context() -> ToolContext | None:
    """Inside a tool's body: the Leasehold context of the call (its idempotency key and fencing
    token, to pass downstream); ``None`` outside one."""
    return _context.get()


def leasehold_tool(
    lc_tool: BaseTool,
    *,
    effect: Effect | str,
    approve_permission: str | None = None,
    requires_approval: bool | None = None,
    preview: PreviewFunc | None = None,
    check: CheckFunc | None = None,
) -> Tool:
    """Declare ``lc_tool`` to Leasehold's registry (under its own name) with its ``effect``
    and, as for any Leasehold tool, an ``approve_permission``, a ``preview(context,
    arguments)`` of a write and a ``check(context, arguments)`` of a non-idempotent write in
    doubt. Its arguments' schema is the LangChain tool's; its body invokes it (a raised
    ``agentruns.tools.OutcomeUnknown`` parks a non-idempotent write in doubt). Returns the
    registered tool; registering the same definition again is a no-op."""
    parameters = convert_to_openai_tool(lc_tool)["function"].get("parameters") or {}
    parameters = {"type": "object", "properties": {}, **parameters}

    def body(context: ToolContext, arguments: dict[str, Any]) -> Any:
        token = _context.set(context)
        try:
            result = lc_tool.invoke(arguments)
        finally:
            _context.reset(token)
        return result.content if isinstance(result, BaseMessage) else result

    body.__qualname__ = f"leasehold_tool[{lc_tool.name}]"
    defined = tool(
        name=lc_tool.name,
        description=lc_tool.description or lc_tool.name,
        effect=Effect(effect),
        parameters=parameters,
        approve_permission=approve_permission,
        requires_approval=requires_approval,
        preview=preview,
        check=check,
    )(body)
    registered = registry.get(defined.name)
    if registered is not None and registered.func.__qualname__ == body.__qualname__:
        registry.unregister(defined.name)  # a LangChain tool declared again (a reload)
    return registry.register(defined)


@contextlib.contextmanager
def active(holding: Holding) -> Iterator[Holding]:
    """Make ``holding`` the one this process's ``ToolNode`` uses for its run while the block
    runs (``start`` and ``resume`` do it)."""
    with _active_lock:
        _active[holding.run_uuid] = holding
    try:
        yield holding
    finally:
        with _active_lock:
            _active.pop(holding.run_uuid, None)


def _holding_of(config: RunnableConfig | None) -> tuple[str, Holding | None]:
    """The thread's run (named by ``configurable['leasehold_run']``, else found by the thread
    id it stores: a replay names only the thread) and its holding in this process."""
    configurable = (config or {}).get("configurable") or {}
    run_uuid = configurable.get(RUN_KEY) or _run_of_thread(configurable.get("thread_id"))
    if not isinstance(run_uuid, str) or not run_uuid:
        raise LeaseLost("this thread is no Leasehold run's (configurable['leasehold_run'])")
    with _active_lock:
        return run_uuid, _active.get(run_uuid)


def _run_of_thread(thread_id: object) -> str | None:
    if not isinstance(thread_id, str) or not thread_id:
        return None
    runs = AgentRun.objects.filter(
        external_framework=FRAMEWORK, external_state__thread_id=thread_id
    ).order_by("-pk")
    found = runs.values_list("uuid", flat=True).first()
    return str(found) if found is not None else None


def _proposed(message: AIMessage) -> list[ProposedCall]:
    return [
        ProposedCall(str(call.get("id") or ""), call["name"], dict(call.get("args") or {}))
        for call in message.tool_calls
    ]


class ToolNode:
    """The graph's tool node under Leasehold: the last AI message's tool calls, run through the
    thread's run (``configurable['leasehold_run']``) and answered as ``ToolMessage``\\ s.

    A turn waiting for a person raises ``interrupt(card)`` (the run waits in the inbox); on
    resume the node runs again and Leasehold applies the decision. Without a holding in this
    process (a replay of an ended run) only recorded calls are answered; any other raises
    ``LeaseLost``: a call never runs without the lease."""

    def __init__(self, *, messages_key: str = "messages") -> None:
        self.messages_key = messages_key

    def __call__(self, state: Mapping[str, Any], config: RunnableConfig) -> dict[str, Any]:
        messages = state[self.messages_key]
        last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        calls = _proposed(last) if last is not None else []
        if not calls:
            return {self.messages_key: []}
        run_uuid, holding = _holding_of(config)
        if holding is None:
            return {self.messages_key: _replayed(run_uuid, calls)}
        while True:
            try:
                outcomes = holding.run_turn(calls)
                break
            except RunPaused as paused:
                # Raises GraphInterrupt; a stale resume value (a decision Leasehold did not
                # let run) returns here, and the paused holding makes the next one raise.
                interrupt(_card_json(paused.card))
        return {
            self.messages_key: [
                ToolMessage(content=o.message, tool_call_id=c.id, name=c.name)
                for c, o in zip(calls, outcomes, strict=True)
            ]
        }


def _card_json(card: Card | None) -> dict[str, Any]:
    return card.to_json() if card is not None else {"framework": FRAMEWORK}


def _replayed(run_uuid: str, calls: Sequence[ProposedCall]) -> list[ToolMessage]:
    answered = []
    for call in calls:
        outcome = external.recorded(run_uuid, call)
        if outcome is None:
            raise LeaseLost(f"call {call.id!r} was never run and this process holds no lease")
        answered.append(ToolMessage(content=outcome.message, tool_call_id=call.id, name=call.name))
    return answered


# --- Driving a graph ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """Where a graph invocation under Leasehold left the run: ``completed`` (with the graph's
    ``output``), ``paused`` (the ``card`` a person decides on), or ``released`` (the graph
    stopped for a reason of its own: the run waits in its framework's queue)."""

    run_uuid: str
    status: str
    thread_id: str
    card: Card | None = None
    output: Any = None


def thread_config(holding: Holding, thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, RUN_KEY: holding.run_uuid}}


def start(
    graph: Any,
    *,
    configuration: AgentConfiguration | str,
    prompt: str,
    initiator: User | None = None,
    thread_id: str | None = None,
    inputs: Any = None,
    final_text: Callable[[Any], str] | None = None,
) -> Result:
    """Open a Leasehold run for a new thread of ``graph`` and invoke it under the run's lease
    (``inputs``: the graph's input, by default ``{"messages": [HumanMessage(prompt)]}``). The
    thread id is the run's stored state."""
    thread = thread_id or str(uuid.uuid4())
    with external.open_run(
        configuration=configuration,
        prompt=prompt,
        framework=FRAMEWORK,
        initiator=initiator,
        state={"thread_id": thread},
    ) as holding:
        payload = inputs if inputs is not None else {"messages": [HumanMessage(prompt)]}
        return _invoke(graph, holding, thread, payload, final_text)


def resume(graph: Any, run_uuid: str, *, final_text: Callable[[Any], str] | None = None) -> Result:
    """Claim the queued run ``run_uuid`` (decided in the inbox, reconciled, or reclaimed by the
    reaper) and continue its thread: with ``Command(resume=…)`` when the graph is interrupted,
    else from its last checkpoint. Raises ``NotHoldable`` when it is not ready."""
    with external.hold(run_uuid, framework=FRAMEWORK) as holding:
        stored = holding.state if isinstance(holding.state, dict) else {}
        thread = str(stored.get("thread_id") or "")
        if not thread:
            holding.fail("its stored state names no LangGraph thread")
            raise LeaseLost("the run's stored state names no thread: it failed")
        snapshot = graph.get_state(thread_config(holding, thread))
        if snapshot.interrupts:
            payload: Any = Command(resume={"leasehold_run": holding.run_uuid, **_decided(holding)})
        else:
            payload = None
        if not snapshot.next and not snapshot.interrupts:  # it ended: only the settle was lost
            return _settled(holding, thread, snapshot.values, final_text)
        return _invoke(graph, holding, thread, payload, final_text)


def resume_all(
    graph: Any, *, limit: int = 100, final_text: Callable[[Any], str] | None = None
) -> list[Result]:
    """``resume`` every run of this framework that is ready (``external.resumable``); a run
    another worker claimed first is skipped."""
    results = []
    for run_uuid in external.resumable(framework=FRAMEWORK, limit=limit):
        try:
            results.append(resume(graph, str(run_uuid), final_text=final_text))
        except external.NotHoldable:
            continue
    return results


def _decided(holding: Holding) -> dict[str, Any]:
    return {"decision": holding.decision} if holding.decision is not None else {}


def _invoke(
    graph: Any,
    holding: Holding,
    thread: str,
    payload: Any,
    final_text: Callable[[Any], str] | None,
) -> Result:
    config = thread_config(holding, thread)
    with active(holding):
        # ``sync``: each step's checkpoint is written before the next step starts, so a process
        # that dies in the tool node resumes from the step before it.
        values = graph.invoke(payload, config, durability="sync")
    if holding.phase == PAUSED:
        return Result(holding.run_uuid, "paused", thread, card=holding.card)
    if graph.get_state(config).next:
        return Result(holding.run_uuid, "released", thread)  # the graph's own interrupt
    return _settled(holding, thread, values, final_text)


def _settled(
    holding: Holding, thread: str, values: Any, final_text: Callable[[Any], str] | None
) -> Result:
    output = (final_text or _last_ai_text)(values)
    holding.complete(output)
    return Result(holding.run_uuid, "completed", thread, output=output)


def _last_ai_text(values: Any) -> str:
    messages = values.get("messages", []) if isinstance(values, Mapping) else []
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    content = last.content if last is not None else ""
    return content if isinstance(content, str) else str(content)
