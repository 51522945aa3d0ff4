"""The tool registry: code declares each tool's name, schema, description and effect (docs/design.md
§4.1).

Owns the definitions of tools, how a name resolves to a tool (static tools first, then dynamic
resolvers such as MCP servers) and how one call is validated and executed. It must never stamp,
check or clear a lease or a fence: the runtime calls ``invoke_tool`` only after its fence hook.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured

from agentruns.models import WRITE_EFFECTS, Effect
from agentruns.tools.schemas import (
    InvalidSchema,
    SchemaError,
    check_schema,
    input_errors,
    schema_errors,
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
    if not callable(tool.func):
        raise ToolDefinitionError(f"tool {tool.name!r}: func is not callable")
    if tool.preview is not None and not callable(tool.preview):
        raise ToolDefinitionError(f"tool {tool.name!r}: preview is not callable")
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
    try:
        check_schema(tool.parameters, what=f"tool {tool.name!r} parameters")
        if tool.input_schema is not None:
            check_schema(tool.input_schema, what=f"tool {tool.name!r} input_schema")
    except InvalidSchema as exc:
        raise ToolDefinitionError(str(exc)) from exc
    if tool.input_schema is None:
        return
    if tool.is_write:
        raise ToolDefinitionError(
            f"tool {tool.name!r} is a {tool.effect} and may not also require human input "
            "(input_schema is for read tools only)"
        )
    declared = tool.input_schema.get("properties", {})
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
    )


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
        )
        check_tool(defined)
        return defined

    return decorate


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call. ``ok`` False means the body failed or never ran (``error``).
    ``in_doubt``: the tool could not tell whether its effect happened (``OutcomeUnknown``)."""

    ok: bool
    content: Any  # JSON-serialisable; what the model sees
    error: str = ""
    in_doubt: bool = False

    @classmethod
    def success(cls, content: Any) -> ToolResult:
        return cls(ok=True, content=content)

    @classmethod
    def failure(cls, error: str) -> ToolResult:
        return cls(ok=False, content=None, error=error)

    def as_message_content(self) -> str:
        """The tool message the model sees: JSON of ``content``, or ``{"error": ...}``.

        Canonical (sorted keys): a continuing segment derives it again from the stored result,
        which PostgreSQL's ``jsonb`` keeps with its keys reordered."""
        if not self.ok:
            return json.dumps({"error": self.error}, ensure_ascii=False)
        return json.dumps(self.content, ensure_ascii=False, sort_keys=True)

    def as_dict(self) -> dict[str, Any]:
        """``{"ok", "content", "error"}`` for an event payload."""
        return {"ok": self.ok, "content": self.content, "error": self.error}


def _one_line(text: str) -> str:
    """A log line: whitespace (newlines included) collapsed, at most 500 characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= 500 else flat[:499] + "…"


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def argument_errors(tool: Tool, arguments: Any) -> str | None:
    """Why ``arguments`` may not be passed to ``tool`` (a message the model can act on), or None.

    Non-object arguments, the provider's ``_unparsed_arguments`` marker (the model sent text
    that is not JSON) and schema violations are refused, and so is every call of a tool whose
    schema cannot be applied (``InvalidSchema``: a definition that bypassed ``check_tool``).
    """
    if not isinstance(arguments, Mapping):
        return (
            f"arguments for tool {tool.name!r} must be a JSON object matching its schema, "
            f"got {type(arguments).__name__}"
        )
    if UNPARSED_ARGUMENTS_KEY in arguments:
        raw = str(arguments[UNPARSED_ARGUMENTS_KEY])[:200]
        return (
            f"arguments for tool {tool.name!r} were not valid JSON ({raw!r}); "
            "call it again with a JSON object matching its schema"
        )
    try:
        problems = schema_errors(tool.parameters, dict(arguments))
    except InvalidSchema as exc:
        return f"tool {tool.name!r} cannot be called: its argument schema is unusable ({exc})"
    if problems:
        return f"invalid arguments for tool {tool.name!r}: " + "; ".join(map(str, problems))
    return None


def invoke_tool(tool: Tool, arguments: Any, context: ToolContext) -> ToolResult:
    """Validate arguments (jsonschema) and call; invalid arguments or a raise → error result.

    Never raises for the tool's sake (only ``BaseException``s such as ``KeyboardInterrupt``
    pass): refused arguments mean the body never runs; an exception in the body becomes
    ``"<ExceptionType>: <message>"`` (logged with its traceback); a return value that is not
    strict JSON becomes an error result. On success ``content`` is the JSON round-trip of the
    return value, so what is stored equals what the model sees. The body gets a deep copy of
    the arguments. No lease or fence is checked here.
    """
    refused = argument_errors(tool, arguments)
    if refused is not None:
        return ToolResult.failure(refused)
    try:
        returned = tool.func(context, copy.deepcopy(dict(arguments)))
    except OutcomeUnknown as exc:
        logger.warning(
            "tool %r: outcome unknown (call %s): %s",
            tool.name,
            context.call_id,
            _one_line(str(exc)),
        )
        return ToolResult(
            ok=False, content=None, error=_truncate(f"outcome unknown: {exc}"), in_doubt=True
        )
    except RemoteToolError as exc:
        logger.warning(
            "tool %r failed (call %s): %s", tool.name, context.call_id, _one_line(str(exc))
        )
        return ToolResult.failure(_truncate(f"{type(exc).__name__}: {exc}"))
    except Exception as exc:
        logger.exception("tool %r failed (call %s)", tool.name, context.call_id)
        return ToolResult.failure(_truncate(f"{type(exc).__name__}: {exc}"))
    try:
        encoded = json.dumps(returned, allow_nan=False)
    except (TypeError, ValueError) as exc:
        logger.error("tool %r returned a value that is not JSON: %s", tool.name, exc)
        return ToolResult.failure(
            _truncate(f"tool {tool.name!r} returned a value that is not JSON-serialisable: {exc}")
        )
    return ToolResult.success(json.loads(encoded))


def validate_input(tool: Tool, values: Any) -> list[SchemaError]:
    """Problems with human-supplied ``values`` for ``tool.input_schema`` (``input_errors``);
    empty when valid. A tool without an input schema accepts no input (one error says so).
    Raises ``InvalidSchema`` for a schema that cannot be applied.
    """
    if tool.input_schema is None:
        return [SchemaError((), f"tool {tool.name!r} takes no human input")]
    return input_errors(tool.input_schema, values)


def overlay_input(tool: Tool, arguments: Mapping[str, Any], values: Mapping[str, Any]) -> dict:
    """A new dict: the model's ``arguments`` with the human's ``values`` laid over them.

    Only keys declared in ``input_schema["properties"]`` are taken from ``values`` (undeclared
    human keys are ignored); keys only the model sent are kept. Validate first with
    ``validate_input``; nothing here validates. Neither input is modified.
    """
    merged = copy.deepcopy(dict(arguments))
    declared = (tool.input_schema or {}).get("properties", {})
    for key in declared:
        if key in values:
            merged[key] = copy.deepcopy(values[key])
    return merged
