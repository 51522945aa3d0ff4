"""What a provider's reply may hold: every reply is checked here, once, before anything of it is
stored, shown, hashed or acted on (docs/design.md §7.1).

A reply comes from outside (a remote server, a script a person wrote) and its parts end up in
``jsonb`` and ``text`` columns, in the event ledger's hashes, in the dialogue sent back to the
model and, for tool calls, in the arguments of a write. ``check_reply`` either returns the reply
in a form every one of those accepts or refuses it with a ``ProviderError`` of kind
``bad_response`` (not retryable: the same question gets the same answer, and a write's
arguments are never guessed at):

* **refused** — anything wrong inside a tool call: arguments holding NUL, a lone surrogate, a
  number that is not finite (``NaN``, ``Infinity``, ``1e999``), a key that is not a string or
  nesting deeper than ``MAX_ARGUMENT_DEPTH``; a call id or name that is not a string, holds NUL
  or a lone surrogate, or is longer than ``MAX_ID_CHARS`` / ``MAX_NAME_CHARS``; more than
  ``MAX_TOOL_CALLS`` calls, or arguments longer than ``MAX_ARGUMENTS_CHARS`` (JSON) in all;
  content that is not a string or is longer than ``MAX_CONTENT_CHARS``; a token count that is
  not an integer from 0 to ``MAX_CALL_TOKENS`` (the total: twice that), or that would take the
  run's total past what its columns hold (``MAX_TOKENS``).
* **normalised** (named in ``ProviderReply.normalised``, which the ``llm`` event records) —
  NUL characters and lone surrogates in the free text (``content``, ``model``) become U+FFFD,
  and a ``model`` name is cut to ``MAX_MODEL_CHARS``: text a person reads, never something that
  runs. Usage keeps only the three counts the run adds up (``USAGE_KEYS``), an integral float
  (``11.0``) read as the integer.

Free of Django and of the database: the runtime calls ``check_reply`` at one point, right after
``Provider.complete`` returns.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from agentruns.providers.base import ErrorKind, ProviderError, ProviderReply, ToolCall
from agentruns.storable import json_problem, shown, storable_text, text_problem

#: A run's token totals are 32-bit integer columns (PostgreSQL ``integer``): the most a run's
#: prompt and completion tokens together may add up to.
MAX_TOKENS = 2**31 - 1
#: The most prompt (or completion) tokens one reply may report, twice that its total: a hundred
#: times the largest context windows offered today; above is a broken or hostile counter.
MAX_CALL_TOKENS = 100_000_000
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")

MAX_CONTENT_CHARS = 1_000_000
MAX_TOOL_CALLS = 128
MAX_ARGUMENTS_CHARS = 1_000_000  # all of one reply's arguments, as compact JSON
MAX_ARGUMENT_DEPTH = 32
MAX_ID_CHARS = 200
MAX_NAME_CHARS = 200
MAX_MODEL_CHARS = 200

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class _Refused(Exception):
    pass


def _refuse(message: str) -> ProviderError:
    return ProviderError(
        f"The provider's reply was refused: {message}.",
        kind=ErrorKind.BAD_RESPONSE,
        retryable=False,
    )


def check_reply(reply: ProviderReply, *, tokens_so_far: int = 0) -> ProviderReply:
    """``reply`` as it may be stored (a new value when something was normalised; see the module
    docstring), or ``ProviderError`` (``bad_response``, not retryable) saying what was refused
    and where. ``tokens_so_far``: the run's prompt plus completion tokens before this reply."""
    try:
        calls = _checked_calls(reply.tool_calls)
        content, content_changed = _checked_content(reply.content)
        usage = _checked_usage(reply.usage, tokens_so_far=tokens_so_far)
    except _Refused as refused:
        raise _refuse(str(refused)) from None
    model, model_changed = _normalised_model(reply.model)
    changed = {"content": content_changed, "model": model_changed}
    normalised = tuple(name for name, was_changed in changed.items() if was_changed)
    same_usage = usage.keys() == reply.usage.keys() and all(
        type(reply.usage[key]) is int for key in usage
    )
    if not normalised and same_usage:
        return reply
    return dataclasses.replace(
        reply,
        content=content,
        tool_calls=calls,
        usage=usage,
        model=model,
        normalised=(*reply.normalised, *normalised),
    )


def _checked_content(content: Any) -> tuple[str, bool]:
    if not isinstance(content, str):
        raise _Refused(f"its content is a {type(content).__name__}, not text")
    if len(content) > MAX_CONTENT_CHARS:
        raise _Refused(
            f"its content is {len(content)} characters long; at most {MAX_CONTENT_CHARS} are kept"
        )
    cleaned = storable_text(content)
    return cleaned, cleaned is not content


def _normalised_model(model: Any) -> tuple[str, bool]:
    if not isinstance(model, str):
        return "", True
    cleaned = storable_text(model)[:MAX_MODEL_CHARS]
    return cleaned, cleaned != model


def _checked_calls(calls: Any) -> list[ToolCall]:
    if not isinstance(calls, list):
        raise _Refused(f"its tool calls are a {type(calls).__name__}, not a list")
    if len(calls) > MAX_TOOL_CALLS:
        raise _Refused(f"it asks for {len(calls)} tool calls; at most {MAX_TOOL_CALLS} are taken")
    size = 0
    for position, call in enumerate(calls, start=1):
        if not isinstance(call, ToolCall):
            raise _Refused(f"tool call {position} is a {type(call).__name__}")
        _check_label(call.id, what="id", limit=MAX_ID_CHARS, position=position)
        _check_label(call.name, what="name", limit=MAX_NAME_CHARS, position=position)
        where = f"tool call {position} ({shown(call.name, 40)})"
        if not isinstance(call.arguments, dict):
            raise _Refused(f"{where} has arguments that are not a JSON object")
        problem = json_problem(call.arguments, max_depth=MAX_ARGUMENT_DEPTH)
        if problem is not None:
            # Never mended: a write runs with exactly what the model sent, or not at all.
            raise _Refused(f"{where} has arguments that cannot be stored as sent: {problem}")
        size += len(_COMPACT(call.arguments))
        if size > MAX_ARGUMENTS_CHARS:
            raise _Refused(
                f"its tool calls' arguments pass {MAX_ARGUMENTS_CHARS} characters of JSON "
                f"(at tool call {position})"
            )
    return calls


def _check_label(value: Any, *, what: str, limit: int, position: int) -> None:
    if not isinstance(value, str):
        raise _Refused(f"tool call {position}: its {what} is a {type(value).__name__}")
    if len(value) > limit:
        raise _Refused(
            f"tool call {position}: its {what} is {len(value)} characters long; at most {limit}"
        )
    problem = text_problem(value)
    if problem is not None:
        raise _Refused(f"tool call {position}: its {what} holds {problem}: {shown(value, 40)}")


def _checked_usage(usage: Any, *, tokens_so_far: int) -> dict[str, int]:
    if not isinstance(usage, dict):
        raise _Refused(f"its usage is a {type(usage).__name__}, not an object")
    counts: dict[str, int] = {}
    for key in USAGE_KEYS:
        if key not in usage or usage[key] is None:
            continue
        value = usage[key]
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _Refused(f"it reported {key}={shown(value, 40)}: not a token count")
        limit = 2 * MAX_CALL_TOKENS if key == "total_tokens" else MAX_CALL_TOKENS
        if value > limit:
            raise _Refused(f"it reported {key}={value}: more than {limit} tokens for one call")
        counts[key] = value
    added = counts.get("prompt_tokens", 0) + counts.get("completion_tokens", 0)
    if tokens_so_far + added > MAX_TOKENS:
        raise _Refused(
            f"its {added} tokens would take the run's total past {MAX_TOKENS} "
            f"(it has used {tokens_so_far})"
        )
    return counts
