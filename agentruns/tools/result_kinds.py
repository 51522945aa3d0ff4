"""What a model reads when a call did not simply run, and the kind of result a tool message is.

A tool message (``ToolResult.as_message_content``) is the call's result as JSON, or
``{"error": text}`` when it failed or never ran. The texts of a call that never ran are fixed
here, once: a person denied it (``DENIED_MESSAGE``), nobody decided before the deadline
(``EXPIRED_MESSAGE``), or the tool refused it before doing anything (``REFUSED_PREFIX`` and why:
``ToolRefused``). ``result_kind`` reads a tool message back the way a model does, so that the
scripted provider's scripts can answer what happened (``agentruns.providers.scripted``).
"""

from __future__ import annotations

import json
from typing import Any

DENIED_MESSAGE = "denied by an operator: this call was not executed"
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
#: Every kind ``result_kind`` answers, in the order a script's ``when`` documents them.
RESULT_KINDS = (OK, ERROR, REFUSED, DENIED, EXPIRED)


def result_kind(content: Any) -> str:
    """The kind of the tool message ``content``: ``denied`` or ``expired`` (the call never ran),
    ``refused`` (its tool refused it before doing anything), ``error`` (any other
    ``{"error": ...}``: it failed, its arguments were refused, its tool is unknown) or ``ok``
    (anything else: what the tool returned, an HTTP error status included)."""
    if not isinstance(content, str):
        return OK
    try:
        parsed = json.loads(content)
    except ValueError:
        return OK
    if not (isinstance(parsed, dict) and set(parsed) == {"error"}):
        return OK
    error = parsed["error"]
    if error == DENIED_MESSAGE:
        return DENIED
    if error == EXPIRED_MESSAGE:
        return EXPIRED
    if isinstance(error, str) and error.startswith(REFUSED_PREFIX):
        return REFUSED
    return ERROR
