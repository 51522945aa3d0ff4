"""Function tools of the OpenAI Agents SDK under Leasehold: ``leasehold_tool`` (docs/external.md).

A guarded tool is two things with one name. In Leasehold's registry, a ``Tool`` with the SDK
tool's JSON schema and the effect, approval permission, preview and check its author declares:
the inbox, the authority rules and the reconciler know it as any tool of Leasehold's own. In
the SDK, a copy of the function tool whose ``needs_approval`` asks the run (writes wait for the
inbox, reads pass) and whose invocation goes through the run (``Holding.execute``: argument
check, fence stamp under the owner guard, the body, the ``tool`` event clearing the fence; a
call recorded before returns its recorded outcome and runs nothing). The SDK's body runs inside
that, as the registered tool's function.

Threads: the SDK runs in an event loop thread (``asgiref.sync.async_to_sync``, see
``_loop``); every call into the run goes back to the thread that holds the lease
(``sync_to_async(thread_sensitive=True)``), where the holding's statements run on that thread's
connection, and so does the tool's Python function (the SDK alone would run it in a worker
thread): the fence, the body and the ``tool`` event on one thread, as in a native segment.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agents import FunctionTool
from agents.function_schema import function_schema
from agents.tool_context import ToolContext as SdkToolContext
from asgiref.sync import async_to_sync, sync_to_async

from agentruns.external import ProposedCall
from agentruns.external.holding import Holding
from agentruns.models import Effect
from agentruns.tools import Tool, ToolContext, registry
from agentruns.tools.registry import CheckFunc, PreviewFunc

#: Marks an SDK tool made by ``leasehold_tool``: its Leasehold name.
GUARDED_ATTRIBUTE = "__leasehold_tool__"

#: The run a guarded tool is called in (set by ``_loop`` around the SDK's run).
current_holding: contextvars.ContextVar[Holding | None] = contextvars.ContextVar(
    "leasehold_holding", default=None
)
#: The SDK's context of the call being executed (set by the guarded invocation).
_sdk_call: contextvars.ContextVar[SdkToolContext[Any] | None] = contextvars.ContextVar(
    "leasehold_sdk_call", default=None
)
#: Leasehold's context of the call whose body runs (idempotency key, fencing token).
_leasehold_call: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "leasehold_call", default=None
)


class NotUnderLeasehold(RuntimeError):
    """A guarded tool was called outside a Leasehold run (``openai_agents.start`` / ``resume``):
    it runs nothing, since nothing would fence it."""


def call_context() -> ToolContext:
    """Leasehold's context of the call whose body is running: ``idempotency_key`` and
    ``fencing_token`` to hand to the system the tool writes to. Raises ``NotUnderLeasehold``
    outside a guarded tool's body."""
    context = _leasehold_call.get()
    if context is None:
        raise NotUnderLeasehold("call_context() is only known inside a guarded tool's body")
    return context


def _holding() -> Holding:
    holding = current_holding.get()
    if holding is None:
        raise NotUnderLeasehold(
            "a guarded tool runs only inside agentruns.external.openai_agents.start or resume"
        )
    return holding


def proposed(call_id: str, name: str, arguments: Any) -> ProposedCall:
    """The run's view of an SDK call: its ``call_id``, the tool's name, the arguments the model
    sent (a JSON object; anything else is kept as the text, which the tool refuses)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        arguments = {"_unparsed_arguments": str(arguments)}
    return ProposedCall(str(call_id), name, arguments)


def _sdk_context(name: str, context: ToolContext, raw: str) -> SdkToolContext[Any]:
    sdk = _sdk_call.get()
    if sdk is None:  # called by a run of Leasehold's own loop
        sdk = SdkToolContext(
            context=None, tool_name=name, tool_call_id=context.call_id, tool_arguments=raw
        )
    return sdk


def _body(inner: FunctionTool) -> Callable[[ToolContext, dict[str, Any]], Any]:
    """The registered tool's function: the SDK tool's Python function, called with the arguments
    the run executes (a person's edit included) in the thread that holds the lease (on its
    connection, as a native tool runs), any exception raised as it is (``OutcomeUnknown``,
    ``ToolRefused`` and failures reach the run, not the SDK's error formatter). An async function
    is awaited on the SDK's loop; a tool without a Python function (built by hand) is invoked
    as the SDK invokes it."""
    func = getattr(inner, "__wrapped__", None)
    schema = function_schema(func, use_docstring_info=False) if callable(func) else None

    def body(context: ToolContext, arguments: dict[str, Any]) -> Any:
        raw = json.dumps(arguments, ensure_ascii=False)
        sdk = _sdk_context(inner.name, context, raw)
        token = _leasehold_call.set(context)
        try:
            if func is None or schema is None:
                return async_to_sync(inner.on_invoke_tool)(sdk, raw)
            args, kwargs = schema.to_call_args(schema.params_pydantic_model(**arguments))
            if schema.takes_context:
                args = [sdk, *args]
            if inspect.iscoroutinefunction(func):
                return async_to_sync(func)(*args, **kwargs)
            return func(*args, **kwargs)
        finally:
            _leasehold_call.reset(token)

    body.__qualname__ = f"guarded.{inner.name}"
    body.__module__ = __name__
    return body


def _needs_approval(name: str) -> Callable[[Any, dict[str, Any], str], Awaitable[bool]]:
    async def needs_approval(context: Any, arguments: dict[str, Any], call_id: str) -> bool:
        holding = _holding()
        call = proposed(call_id, name, arguments)
        return bool(await sync_to_async(holding.needs_approval, thread_sensitive=True)(call))

    return needs_approval


def _invoke(name: str) -> Callable[[SdkToolContext[Any], str], Awaitable[Any]]:
    async def invoke(context: SdkToolContext[Any], arguments: str) -> Any:
        holding = _holding()
        call = proposed(context.tool_call_id, name, arguments)
        token = _sdk_call.set(context)
        try:
            outcome = await sync_to_async(holding.execute, thread_sensitive=True)(call)
        finally:
            _sdk_call.reset(token)
        if outcome.ran and outcome.ok and isinstance(outcome.result, str):
            return outcome.result  # what the SDK alone would have handed the model
        return outcome.message

    return invoke


def leasehold_tool(
    tool: FunctionTool,
    *,
    effect: Effect | str,
    approve_permission: str | None = None,
    requires_approval: bool | None = None,
    preview: PreviewFunc | None = None,
    check: CheckFunc | None = None,
) -> FunctionTool:
    """The SDK function tool ``tool`` under Leasehold: registered in Leasehold's registry with
    its effect (``read``, ``idempotent_write``, ``non_idempotent_write``), ``approve_permission``,
    ``requires_approval`` (default: writes need approval), ``preview`` and ``check`` — as
    ``agentruns.tools.tool`` declares them — and returned as a copy whose approval and
    invocation go through the run. Inside its body, ``call_context()`` gives the idempotency
    key and fencing token. Refused (``ToolDefinitionError``) as ``registry.register`` refuses:
    a name or schema Leasehold does not accept, another tool of that name."""
    if not isinstance(tool, FunctionTool):
        raise TypeError("leasehold_tool takes a function tool (agents.function_tool)")
    inner = dataclasses.replace(
        tool, _failure_error_function=None, _use_default_failure_error_function=False
    )
    registry.register(
        Tool(
            name=tool.name,
            description=tool.description,
            parameters=dict(tool.params_json_schema),
            effect=Effect(effect),
            func=_body(inner),
            requires_approval=requires_approval,
            approve_permission=approve_permission,
            preview=preview,
            check=check,
        )
    )
    guarded = dataclasses.replace(
        tool, on_invoke_tool=_invoke(tool.name), needs_approval=_needs_approval(tool.name)
    )
    setattr(guarded, GUARDED_ATTRIBUTE, tool.name)
    return guarded


def is_guarded(tool: Any) -> bool:
    return isinstance(tool, FunctionTool) and isinstance(
        getattr(tool, GUARDED_ATTRIBUTE, None), str
    )
