"""What every HTTP provider shares (docs/design.md §6.7, §7.1): an error's text made safe to
store and show, an HTTP status put in its retry class, a tool call's arguments read as a JSON
object, and the API key read from the variable a configuration names. Free of any SDK:
``openai_compat`` and ``anthropic_messages`` both use it, so the two classify and sanitise alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentruns.exceptions import SecretEnvRefused
from agentruns.providers.base import UNPARSED_KEY, ErrorKind, ProviderError
from agentruns.secrets import read_secret_env
from agentruns.storable import storable_text

MAX_MESSAGE = 500
#: The SDKs' status-error text starts "Error code: 529 - …": the status is said apart.
SDK_STATUS_PREFIX = re.compile(r"^Error code: \d+(\s+-\s+)?")
_SECRET_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)\S+"),
    re.compile(r"\bsk-[A-Za-z0-9_\-*.]{4,}"),
)


def sanitise(text: str, secret: str | None) -> str:
    """``text`` without the key (or anything shaped like one: a bearer token, ``sk-…``, which
    covers ``sk-ant-…``), cut to a storable length, with what no column stores (NUL, lone
    surrogates: a server's error text may hold them) replaced."""
    text = storable_text(text)
    if secret:
        text = text.replace(secret, "[redacted]")
    text = _SECRET_PATTERNS[0].sub(r"\1[redacted]", text)
    text = _SECRET_PATTERNS[1].sub("sk-[redacted]", text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def status_kind(status: int) -> tuple[str, bool]:
    """The ``ErrorKind`` of an HTTP error status and whether it is retried: 408 (``timeout``),
    429 (``rate_limited``) and every 5xx (``server_error``, Anthropic's 529 "overloaded"
    included) are; 401/403 (``auth``), 400/404/422 (``bad_request``) and the rest
    (``unknown``) are not."""
    if status == 429:
        return ErrorKind.RATE_LIMITED, True
    if status == 408:
        return ErrorKind.TIMEOUT, True
    if status >= 500:
        return ErrorKind.SERVER_ERROR, True
    if status in (401, 403):
        return ErrorKind.AUTH, False
    if status in (400, 404, 422):
        return ErrorKind.BAD_REQUEST, False
    return ErrorKind.UNKNOWN, False


def bad_response(message: str, secret: str | None) -> ProviderError:
    """``bad_response`` (not retried): the endpoint answered something that is not a reply."""
    return ProviderError(sanitise(message, secret), kind=ErrorKind.BAD_RESPONSE, retryable=False)


def parse_arguments(raw: Any) -> dict[str, Any]:
    """A tool call's JSON arguments as a dict: a dict as it is; empty → ``{}``; not a JSON
    object → ``{UNPARSED_KEY: raw}`` so schema validation reports it to the model. Parsed as
    Python's ``json`` does (``NaN``, ``1e999``, ``"\\u0000"`` included): ``check_reply`` refuses
    what cannot be stored. Nesting past the parser's stack is ``bad_response``."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        parsed = json.loads(raw)
    except (TypeError, ValueError):
        parsed = None
    except RecursionError:
        raise ProviderError(
            "The provider's reply was refused: a tool call's arguments are nested too deeply "
            "to parse.",
            kind=ErrorKind.BAD_RESPONSE,
            retryable=False,
        ) from None
    if isinstance(parsed, dict):
        return parsed
    return {UNPARSED_KEY: raw if isinstance(raw, str) else repr(raw)}


def read_api_key(api_key_env: str) -> str:
    """The API key in the environment variable ``api_key_env`` (an allowed name,
    ``agentruns.secrets``), read now. Blank, unset or empty is ``auth``; a name the secret rule
    refuses is ``configuration`` (its cause a ``SecretEnvRefused``, and the variable is never
    read); neither is retried, and both come before any request is sent."""
    if not api_key_env:
        raise ProviderError(
            "The configuration names no API key environment variable (api_key_env is blank).",
            kind=ErrorKind.AUTH,
            retryable=False,
        )
    try:
        key = read_secret_env(api_key_env, what="api_key_env") or ""
    except SecretEnvRefused as exc:
        raise ProviderError(exc.message, kind=ErrorKind.CONFIGURATION, retryable=False) from exc
    if not key:
        raise ProviderError(
            f"The environment variable {api_key_env} (api_key_env) is not set "
            "or empty; it must hold the provider's API key.",
            kind=ErrorKind.AUTH,
            retryable=False,
        )
    return key
