"""The tool registry: code declares each tool's name, schema, description and effect (docs/design.md
§4.1).

Owns the definitions of tools, the context a call receives and how a name resolves to a tool
(static tools first, then dynamic resolvers such as MCP servers); one call is validated and
executed by ``agentruns.tools.invocation``. It must never stamp, check or clear a lease or a
fence: the runtime calls ``invoke_tool`` only after its fence hook.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured

from agentruns.models import WRITE_EFFECTS, Effect
from agentruns.tools.schemas import (
    InvalidSchema,
    check_schema,
)
from agentruns.turns import canonical_json

logger = logging.getLogger(__name__)

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# A Django permission as ``user.has_perm`` takes it: ``"<app_label>.<codename>"``.
PERMISSION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]{1,100}$")
# The key a provider puts in a call's arguments when the model sent text that is not JSON.
UNPARSED_ARGUMENTS_KEY = "_unparsed_arguments"
MAX_ERROR_CHARS = 2000

ToolFunc = Callable[["ToolContext", dict[str, Any]], Any]
#: ``preview(context, arguments)``: what a write will change, without changing anything.
PreviewFunc = Callable[["ToolContext", dict[str, Any]], Any]
#: ``check(context, arguments)``: whether an in-doubt call landed (a ``CheckAnswer``), read-only.
CheckFunc = Callable[["CheckContext", dict[str, Any]], "CheckAnswer"]
Resolver = Callable[[str], "Tool | None"]
Lister = Callable[[], Iterable["Tool"]]


class OutcomeUnknown(Exception):
    """Raised by a tool when the outcome of its call is not known: a timeout or a lost connection
    after the request may have been sent. For a non-idempotent write the run then waits for
    reconciliation instead of telling the model the call failed (docs/design.md §9.1). A definite
    answer — an HTTP status, an error result, a refusal before anything was sent — is a result,
    not this."""


class RemoteToolError(Exception):
    """A definite failure a tool reports about a remote system — an error answer, a refusal, a
    server that could not be reached before anything was sent. The model reads the message; it
    is logged as a one-line warning (a traceback is for Leasehold's own bugs)."""


class ToolRefused(Exception):
    """Raised by a tool that refuses a call before doing anything: nothing was sent, nothing
    changed (an address the webhook allowlist refuses). The model reads ``refused, nothing was
    done: <message>``, the timeline *refused — not sent*; it is logged as a one-line warning
    (an expected refusal, not a failure). A failure after the tool began is not this."""


class ToolDefinitionError(ImproperlyConfigured):
    """A tool definition was refused at registration (bad name, schema, effect or a clash)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool call receives beside its arguments (docs/design.md §4.3)."""

    run_uuid: UUID
    call_id: str
    initiator_id: int | None
    fencing_token: int  # the run's lease_epoch at the time of the call
    timeout_seconds: float

    @property
    def idempotency_key(self) -> str:
        """``<run uuid>:<call id>``: pass it to any downstream system that understands one."""
        return f"{self.run_uuid}:{self.call_id}"


@dataclass(frozen=True)
class CheckContext(ToolContext):
    """What a tool's ``check`` receives: the call's context as it ran (its idempotency key and
    fencing token, the lease epoch it was sent under) and the call itself (``call_id``, ``name``
    and ``arguments``). ``attempt`` counts the checks of this call, from 1."""

    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1


LANDED = "landed"
NOT_LANDED = "not_landed"
UNKNOWN = "unknown"
CHECK_VERDICTS = (LANDED, NOT_LANDED, UNKNOWN)
#: The most of a check's evidence kept (in the event and on the card).
MAX_EVIDENCE_CHARS = 500


@dataclass(frozen=True)
class CheckAnswer:
    """What a check found out about an in-doubt call: ``landed`` (with, optionally, the result
    the model should see), ``not_landed`` or ``unknown``; ``evidence`` says how it knows (shown
    to staff, recorded in the event). Build it with ``landed()``, ``not_landed()`` or
    ``unknown()``."""

    verdict: str
    evidence: str = ""
    result: Any = None

    def __post_init__(self) -> None:
        if self.verdict not in CHECK_VERDICTS:
            raise ValueError(f"a check answers one of {', '.join(CHECK_VERDICTS)}")
        object.__setattr__(self, "evidence", truncated(str(self.evidence), MAX_EVIDENCE_CHARS))

    @classmethod
    def landed(cls, evidence: str = "", *, result: Any = None) -> CheckAnswer:
        return cls(LANDED, evidence, result)

    @classmethod
    def not_landed(cls, evidence: str = "") -> CheckAnswer:
        return cls(NOT_LANDED, evidence)

    @classmethod
    def unknown(cls, evidence: str = "") -> CheckAnswer:
        return cls(UNKNOWN, evidence)


def _empty_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One tool definition. ``func(context, arguments)`` must honour ``context.timeout_seconds``.

    ``effect`` is coerced to ``Effect`` (a bad value raises ``ValueError``); every other check
    happens in ``check_tool``, which ``ToolRegistry.register`` and ``tool()`` run.
    """

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments
    effect: Effect
    func: ToolFunc
    input_schema: dict[str, Any] | None = None  # typed values a human supplies (reads only)
    # None: decided by the effect (writes need approval). Remote tools set it from their server.
    requires_approval: bool | None = None
    # The permission (``"app_label.codename"``) a human needs, beside ``decide_agentrun``, to
    # approve a turn that calls this tool or to say whether its in-doubt call landed
    # (docs/design.md §5.6). None: deciding needs no more than ``decide_agentrun``.
    approve_permission: str | None = None
    source: str = "local"  # "local" or "mcp"
    hints: dict[str, Any] = field(default_factory=dict)  # shown to staff, never decide anything
    # preview(context, arguments) -> what the write will change (docs/design.md §5.10): read-only,
    # honours context.timeout_seconds, returns a turns.Preview or {"summary", "target", "changes"}.
    preview: PreviewFunc | None = None
    # check(context, arguments) -> CheckAnswer (non-idempotent writes only): asked, read-only and
    # with the tool timeout, whether a call whose outcome is in doubt landed (README, "Tools
    # that check their own in-doubt writes"). None: a person decides.
    check: CheckFunc | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "effect", Effect(self.effect))

    @property
    def is_write(self) -> bool:
        """True for ``idempotent_write`` and ``non_idempotent_write``."""
        return self.effect in WRITE_EFFECTS

    @property
    def needs_approval(self) -> bool:
        """``requires_approval`` when set; otherwise True exactly for write effects."""
        if self.requires_approval is not None:
            return self.requires_approval
        return self.is_write

    @property
    def needs_input(self) -> bool:
        """True when a human must supply typed values (``input_schema``) before it runs."""
        return self.input_schema is not None

    def openai_schema(self) -> dict[str, Any]:
        """{"type": "function", "function": {"name", "description", "parameters"}} (a copy)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def check_tool(tool: Tool) -> None:
    """Raise ``ToolDefinitionError`` unless ``tool`` is a definition the registry may hold.

    Refuses: a name outside ``^[a-zA-Z0-9_-]{1,64}$``; an empty description; a non-callable
    func; an ``approve_permission`` that is not ``"app_label.codename"``; parameters or
    input_schema that are not valid object schemas (``check_schema``: a pattern that does not
    compile, a reference outside the schema); an ``input_schema`` on a write tool
    (docs/design.md §4.1); an input property the parameters would reject after the overlay."""
    if not isinstance(tool.name, str) or not TOOL_NAME_RE.fullmatch(tool.name):
        raise ToolDefinitionError(
            f"tool name {tool.name!r} must match {TOOL_NAME_RE.pattern} (letters, digits, _ and -)"
        )
    if not isinstance(tool.description, str) or not tool.description.strip():
        raise ToolDefinitionError(f"tool {tool.name!r} needs a description")
    _check_callables(tool)
    if tool.source not in {"local", "mcp"}:
        raise ToolDefinitionError(f"tool {tool.name!r}: source must be 'local' or 'mcp'")
    if tool.approve_permission is not None and not (
        isinstance(tool.approve_permission, str)
        and PERMISSION_RE.fullmatch(tool.approve_permission)
    ):
        raise ToolDefinitionError(
            f"tool {tool.name!r}: approve_permission {tool.approve_permission!r} must be "
            "'app_label.codename', as user.has_perm takes it"
        )
    _check_schemas(tool)
    if tool.input_schema is not None:
        _check_input_schema(tool, tool.input_schema)


def _check_callables(tool: Tool) -> None:
    """``func`` callable; ``preview`` and ``check`` callable when declared, a check only on a
    non-idempotent write."""
    if not callable(tool.func):
        raise ToolDefinitionError(f"tool {tool.name!r}: func is not callable")
    if tool.preview is not None and not callable(tool.preview):
        raise ToolDefinitionError(f"tool {tool.name!r}: preview is not callable")
    if tool.check is None:
        return
    if not callable(tool.check):
        raise ToolDefinitionError(f"tool {tool.name!r}: check is not callable")
    if tool.effect != Effect.NON_IDEMPOTENT_WRITE:
        raise ToolDefinitionError(
            f"tool {tool.name!r} is a {tool.effect}: only a non_idempotent_write can be in "
            "doubt, so only it may declare a check"
        )


def _check_schemas(tool: Tool) -> None:
    try:
        check_schema(tool.parameters, what=f"tool {tool.name!r} parameters")
        if tool.input_schema is not None:
            check_schema(tool.input_schema, what=f"tool {tool.name!r} input_schema")
    except InvalidSchema as exc:
        raise ToolDefinitionError(str(exc)) from exc


def _check_input_schema(tool: Tool, input_schema: dict[str, Any]) -> None:
    """Human input on a read tool only, every input property one its parameters accept."""
    if tool.is_write:
        raise ToolDefinitionError(
            f"tool {tool.name!r} is a {tool.effect} and may not also require human input "
            "(input_schema is for read tools only)"
        )
    declared = input_schema.get("properties", {})
    accepted = tool.parameters.get("properties", {})
    if tool.parameters.get("additionalProperties") is False:
        missing = sorted(set(declared) - set(accepted))
        if missing:
            raise ToolDefinitionError(
                f"tool {tool.name!r}: input properties {missing} are not accepted by its "
                "parameters (additionalProperties is false), so the overlay could never validate"
            )


def _definition_key(tool: Tool) -> tuple[Any, ...]:
    """What makes two definitions "the same": every field, the function by its import path."""
    func_path = (getattr(tool.func, "__module__", None), getattr(tool.func, "__qualname__", None))
    return (
        tool.name,
        tool.description,
        canonical_json(tool.parameters),
        str(tool.effect),
        canonical_json(tool.input_schema),
        tool.requires_approval,
        tool.approve_permission,
        tool.source,
        canonical_json(tool.hints),
        func_path if None not in func_path else id(tool.func),
        _function_key(tool.check),
    )


def _function_key(func: Callable[..., Any] | None) -> Any:
    if func is None:
        return None
    path = (getattr(func, "__module__", None), getattr(func, "__qualname__", None))
    return path if None not in path else id(func)


@dataclass(frozen=True)
class _ResolverEntry:
    resolve: Resolver
    list_tools: Lister | None


class ToolRegistry:
    """Static tools by name plus dynamic resolvers. Thread-safe; a static name always wins.

    Resolvers (``add_resolver``) let remote tools (MCP) appear without being registered here;
    a resolver must never be able to shadow or relabel a static tool. A resolver that raises
    or returns an invalid tool is logged and treated as "no such tool" (so the effect fails
    closed to ``non_idempotent_write``).
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._resolvers: list[_ResolverEntry] = []
        self._lock = threading.Lock()

    def register(self, tool: Tool) -> Tool:
        """Add a static tool and return the registered definition.

        Re-registering an identical definition is a no-op (Django's ``ready()`` may run twice);
        the same name with a different definition raises ``ToolDefinitionError``, as does any
        refusal of ``check_tool``.
        """
        check_tool(tool)
        with self._lock:
            existing = self._tools.get(tool.name)
            if existing is not None:
                if _definition_key(existing) == _definition_key(tool):
                    return existing
                raise ToolDefinitionError(
                    f"a different tool named {tool.name!r} is already registered"
                )
            self._tools[tool.name] = tool
        return tool

    def register_all(self, tools: Iterable[Tool]) -> list[Tool]:
        """``register`` each tool in order; stops at the first refusal."""
        return [self.register(t) for t in tools]

    def unregister(self, name: str) -> None:
        """Forget a static tool (tests and operator tooling); unknown names are ignored."""
        with self._lock:
            self._tools.pop(name, None)

    def add_resolver(self, resolve: Resolver, *, list_tools: Lister | None = None) -> None:
        """Consult ``resolve(name) -> Tool | None`` for names no static tool has.

        ``list_tools()`` (optional) returns the tools the resolver offers, for ``all()``.
        Adding the same resolver twice is a no-op.
        """
        with self._lock:
            if any(entry.resolve == resolve for entry in self._resolvers):
                return
            self._resolvers.append(_ResolverEntry(resolve, list_tools))

    def remove_resolver(self, resolve: Resolver) -> None:
        """Stop consulting ``resolve`` (compared with ``==``, so bound methods match); unknown
        resolvers are ignored."""
        with self._lock:
            self._resolvers = [e for e in self._resolvers if e.resolve != resolve]

    def get(self, name: str) -> Tool | None:
        """The static tool of that name, else the first resolver's valid answer, else None."""
        with self._lock:
            static = self._tools.get(name)
            resolvers = list(self._resolvers)
        if static is not None:
            return static
        for entry in resolvers:
            try:
                found = entry.resolve(name)
            except Exception:
                logger.exception("tool resolver %r failed for %r", entry.resolve, name)
                continue
            if found is not None and self._acceptable(found, expected_name=name):
                return found
        return None

    def all(self, *, include_resolvers: bool = True) -> list[Tool]:
        """Static tools (registration order), then resolver-listed tools whose names are new."""
        with self._lock:
            tools = list(self._tools.values())
            resolvers = list(self._resolvers) if include_resolvers else []
        seen = {t.name for t in tools}
        for entry in resolvers:
            if entry.list_tools is None:
                continue
            try:
                listed = list(entry.list_tools())
            except Exception:
                logger.exception("tool resolver listing %r failed", entry.list_tools)
                continue
            for found in listed:
                if found.name not in seen and self._acceptable(found, expected_name=found.name):
                    seen.add(found.name)
                    tools.append(found)
        return tools

    def select(self, allowed: Sequence[str]) -> list[Tool]:
        """The tools a configuration may use: ``allowed`` names in order (unknown ones skipped);
        an empty allow-list means every tool (docs/design.md §4.2)."""
        if not allowed:
            return self.all()
        tools = []
        for name in dict.fromkeys(allowed):
            found = self.get(name)
            if found is not None:
                tools.append(found)
        return tools

    def effect_of(self, name: str) -> Effect:
        """Unknown names resolve to non_idempotent_write (fail closed)."""
        found = self.get(name)
        return Effect.NON_IDEMPOTENT_WRITE if found is None else found.effect

    @staticmethod
    def _acceptable(tool: Any, *, expected_name: str) -> bool:
        if not isinstance(tool, Tool) or tool.name != expected_name:
            logger.warning("tool resolver returned %r for %r; ignored", tool, expected_name)
            return False
        try:
            check_tool(tool)
        except ToolDefinitionError:
            logger.exception("tool resolver returned an invalid tool %r; ignored", tool.name)
            return False
        return True


registry = ToolRegistry()


def tool(
    *,
    name: str,
    description: str,
    effect: Effect,
    parameters: dict[str, Any] | None = None,
    input_schema: dict[str, Any] | None = None,
    requires_approval: bool | None = None,
    approve_permission: str | None = None,
    hints: dict[str, Any] | None = None,
    preview: PreviewFunc | None = None,
    check: CheckFunc | None = None,
) -> Callable[[ToolFunc], Tool]:
    """Decorator: turn ``func(context, arguments)`` into a checked ``Tool``.

    It does NOT register the tool: an app registers its tools in ``AppConfig.ready()`` with
    ``registry.register``. ``parameters`` defaults to an object schema taking no arguments.
    Raises ``ToolDefinitionError`` at decoration time for any definition ``check_tool`` refuses.
    """

    def decorate(func: ToolFunc) -> Tool:
        defined = Tool(
            name=name,
            description=description,
            parameters=parameters if parameters is not None else _empty_parameters(),
            effect=effect,
            func=func,
            input_schema=input_schema,
            requires_approval=requires_approval,
            approve_permission=approve_permission,
            hints=dict(hints or {}),
            preview=preview,
            check=check,
        )
        check_tool(defined)
        return defined

    return decorate


def one_line(text: str) -> str:
    """A log line: whitespace (newlines included) collapsed, at most 500 characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= 500 else flat[:499] + "…"


def truncated(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
