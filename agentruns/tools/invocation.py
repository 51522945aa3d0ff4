"""One tool call: its arguments checked against the tool's schema, the body called, and what it
returned (``ToolResult``, made storable: ``stored_result``); a person's input laid over the
model's arguments (docs/design.md §4.1, §5.7). Never stamps, checks or clears a lease or a fence:
the runtime calls ``invoke_tool`` only after its fence hook.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentruns.storable import KINDS, TEXT, Mended, NotJson, mend_json, storable_text
from agentruns.tools.registry import (
    UNPARSED_ARGUMENTS_KEY,
    OutcomeUnknown,
    RemoteToolError,
    Tool,
    ToolContext,
    ToolRefused,
    one_line,
    truncated,
)
from agentruns.tools.result_kinds import REFUSED_PREFIX
from agentruns.tools.schemas import InvalidSchema, SchemaError, input_errors, schema_errors

logger = logging.getLogger(__name__)

#: A result whose compact JSON is longer is stored (and shown to the model) cut: its beginning
#: and a note saying how long it was — as much as a provider's reply may hold.
MAX_RESULT_CHARS = 1_000_000
#: Nesting deeper than this in a result is cut (a string says so): room is left for the event
#: that stores it (a reconciliation nests it two levels down) under ``storable.MAX_DEPTH``.
MAX_RESULT_DEPTH = 64


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call. ``ok`` False means the body failed or never ran (``error``).
    ``in_doubt``: the tool could not tell whether its effect happened (``OutcomeUnknown``).
    ``refused``: the tool refused the call before doing anything (``ToolRefused``).
    ``normalised``: what was changed so that it could be stored (``storable.mend_json``'s kinds:
    ``text``, ``number``, ``depth``, ``size``); the ``tool`` event records it."""

    ok: bool
    content: Any  # JSON-serialisable; what the model sees
    error: str = ""
    in_doubt: bool = False
    normalised: tuple[str, ...] = ()
    refused: bool = False

    @classmethod
    def success(cls, content: Any) -> ToolResult:
        return cls(ok=True, content=content)

    @classmethod
    def failure(cls, error: str, *, in_doubt: bool = False) -> ToolResult:
        """A failure whose ``error`` is made storable (cut at ``MAX_ERROR_CHARS``, NUL and lone
        surrogates replaced: marked ``text``)."""
        cut = truncated(error)
        mended = storable_text(cut)
        return cls(
            ok=False,
            content=None,
            error=mended,
            in_doubt=in_doubt,
            normalised=(TEXT,) if mended is not cut else (),
        )

    @classmethod
    def refusal(cls, reason: str) -> ToolResult:
        """A call its tool refused before doing anything: the error is ``REFUSED_PREFIX`` and
        ``reason`` (made storable as ``failure`` makes it)."""
        failed = cls.failure(REFUSED_PREFIX + reason)
        return cls(
            ok=False, content=None, error=failed.error, normalised=failed.normalised, refused=True
        )

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


def invoke_tool(
    tool: Tool, arguments: Any, context: ToolContext, *, checked: bool = False
) -> ToolResult:
    """Validate arguments (jsonschema) and call; invalid arguments or a raise → error result.

    Never raises for the tool's sake (only ``BaseException``s such as ``KeyboardInterrupt``
    pass): refused arguments mean the body never runs; an exception in the body becomes
    ``"<ExceptionType>: <message>"`` (logged with its traceback; a ``ToolRefused`` is a
    ``refusal``, logged as a one-line warning). What it returned is made
    storable by ``stored_result`` — mended and marked, or an error result when it is not JSON
    at all — so what is stored equals what the model sees. The body gets a deep copy of the
    arguments. No lease or fence is checked here. ``checked``: the caller has just had
    ``argument_errors`` accept these very arguments for this very tool (the segment's check
    before a turn runs), so they are not checked twice.
    """
    refused = None if checked else argument_errors(tool, arguments)
    if refused is not None:
        return ToolResult.failure(refused)
    try:
        returned = tool.func(context, copy.deepcopy(dict(arguments)))
    except ToolRefused as exc:
        logger.warning(
            "tool %r refused the call (call %s), nothing was done: %s",
            tool.name,
            context.call_id,
            one_line(_message(exc)),
        )
        return ToolResult.refusal(_message(exc))
    except OutcomeUnknown as exc:
        logger.warning(
            "tool %r: outcome unknown (call %s): %s",
            tool.name,
            context.call_id,
            one_line(_message(exc)),
        )
        return ToolResult.failure(f"outcome unknown: {_message(exc)}", in_doubt=True)
    except RemoteToolError as exc:
        logger.warning(
            "tool %r failed (call %s): %s", tool.name, context.call_id, one_line(_message(exc))
        )
        return ToolResult.failure(f"{type(exc).__name__}: {_message(exc)}")
    except Exception as exc:
        logger.exception("tool %r failed (call %s)", tool.name, context.call_id)
        return ToolResult.failure(f"{type(exc).__name__}: {_message(exc)}")
    return stored_result(tool.name, returned)


def stored_result(name: str, returned: Any) -> ToolResult:
    """What a tool returned, as it is stored and shown to the model (docs/design.md §4.1): the
    call has run, so its result is mended, never refused (``storable.mend_json``: NUL and lone
    surrogates → U+FFFD, NaN / Infinity → ``"NaN"`` / ``"Infinity"``, nesting past
    ``MAX_RESULT_DEPTH`` and JSON past ``MAX_RESULT_CHARS`` cut, each named in ``normalised``).
    A value JSON cannot hold at all (bytes, an object, a circular structure), or one that
    raises while it is read, is an error result saying that the tool ran. A tool that had to
    mend what it received itself (an MCP answer read off the wire) returns ``Mended``: its marks
    are kept with these. Never raises (but a ``BaseException``)."""
    earlier: tuple[str, ...] = ()
    if isinstance(returned, Mended):
        returned, earlier = returned.value, tuple(returned.normalised)
    try:
        mended = mend_json(returned, max_chars=MAX_RESULT_CHARS, max_depth=MAX_RESULT_DEPTH)
    except NotJson as exc:
        problem = str(exc)
    except Exception as exc:  # a hostile value: its own code raised while it was read
        problem = f"reading it raised {type(exc).__name__}"
    else:
        marks = {*earlier, *mended.normalised}
        normalised = tuple(kind for kind in KINDS if kind in marks)
        return ToolResult(ok=True, content=mended.value, normalised=normalised)
    logger.error("tool %r returned what JSON cannot hold: %s", name, one_line(problem))
    return ToolResult.failure(f"tool {name!r} ran, but returned what JSON cannot hold: {problem}")


def _message(exc: BaseException) -> str:
    """``str(exc)``, or a note when even that raises (an exception of hostile code)."""
    try:
        return str(exc)
    except Exception as inner:
        return f"(its message could not be read: {type(inner).__name__})"


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
