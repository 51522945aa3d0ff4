"""What a model reads when a call did not simply run, and the kind of result a tool message is.

A tool message (``ToolResult.as_message_content``) is the call's result as JSON, or
``{"error": text}`` when it failed or never ran; a call a person decided in particular is marked
as such (``runtime.transcript.tool_message_content``). The texts of a call that never ran are
fixed here, once: a person denied it (``denied_message``), nobody decided before the deadline
(``EXPIRED_MESSAGE``), or the tool refused it before doing anything (``REFUSED_PREFIX`` and why:
``ToolRefused``). ``result_kind`` reads a tool message back the way a model does, so that the
scripted provider's scripts can answer what happened (``agentruns.providers.scripted``).
"""

from __future__ import annotations

import json
from typing import Any

#: A denied call's error ends so; ``denied_message`` says who denied it.
DENIED_SUFFIX = ": this call was not executed"
DENIED_MESSAGE = f"denied by an operator{DENIED_SUFFIX}"
EXPIRED_MESSAGE = (
    "the request for approval (or input) expired: nobody decided before its deadline, so this "
    "call was not executed"
)
#: A refused call's error starts with this; the tool's reason follows.
REFUSED_PREFIX = "refused, nothing was done: "

OK = "ok"
ERROR = "error"
REFUSED = "refused"
DENIED = "denied"
EXPIRED = "expired"
ANSWERED = "answered"
#: Every kind ``result_kind`` answers.
RESULT_KINDS = (OK, ERROR, REFUSED, DENIED, EXPIRED, ANSWERED)

# The keys of a message that is a call's error: a denial may carry the reviewer's reason.
_ERROR_KEYS = frozenset({"error", "reason_given_by_the_reviewer"})


def denied_message(decider: str) -> str:
    """What the model reads as a denied call's error: who denied it (an operator when not
    known)."""
    return f"denied by {decider}{DENIED_SUFFIX}" if decider else DENIED_MESSAGE


def result_kind(content: Any) -> str:
    """The kind of the tool message ``content``: ``denied`` or ``expired`` (the call never ran),
    ``answered`` (a person gave its result in place of running it), ``refused`` (its tool
    refused it before doing anything), ``error`` (any other error: it failed, its arguments
    were refused, its tool is unknown) or ``ok`` (anything else: what the tool returned, an
    HTTP error status included)."""
    try:
        parsed = json.loads(content) if isinstance(content, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return OK
    if "answered_by_a_person" in parsed:
        return ANSWERED
    if "arguments_edited_by_a_person" in parsed:  # it ran, with a person's arguments
        return ERROR if "error" in parsed else OK
    if "error" not in parsed or not set(parsed) <= _ERROR_KEYS:
        return OK
    return _error_kind(parsed["error"])


def _error_kind(error: Any) -> str:
    text = error if isinstance(error, str) else ""
    if text.startswith("denied by ") and text.endswith(DENIED_SUFFIX):
        return DENIED
    if text == EXPIRED_MESSAGE:
        return EXPIRED
    if text.startswith(REFUSED_PREFIX):
        return REFUSED
    return ERROR
