"""Where Leasehold may send HTTP requests of its own: the ``WEBHOOK_ALLOWLIST`` rule, one function
for every sender (the playground's ``call_webhook``, a configuration's notification webhook).

``webhook_target`` decides whether a URL may be reached; ``post_json`` POSTs a JSON body to an
allowed URL with a timeout, no proxy and no redirect. Never reads the database.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
BODY_CHARS = 2000


class WebhookRefused(PermissionError):
    """The webhook URL is not allowed; nothing was sent."""


def _allowlist_key(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def webhook_target(url: str, allowlist: list[str]) -> str:
    """The ``host`` or ``host:port`` that ``url`` would reach, if ``allowlist`` allows it.

    Raises ``WebhookRefused`` otherwise: a scheme other than http/https, userinfo
    (``user@host``), no host, a bad port, whitespace/control characters or backslashes, or a
    host not allowed. An entry ``host`` allows that host on the scheme's default port only; an
    entry ``host:port`` allows exactly that port (IPv6 as ``[::1]:8080``). Case-insensitive.
    """
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
        raise WebhookRefused("the URL contains whitespace, control characters or backslashes")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise WebhookRefused(f"only http and https URLs are allowed, not {scheme or 'none'!r}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise WebhookRefused("URLs with user information (user@host) are not allowed")
    host = (parts.hostname or "").lower()
    if not host:
        raise WebhookRefused("the URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise WebhookRefused("the URL has an invalid port") from None
    allowed = {entry.strip().lower() for entry in allowlist if entry.strip()}
    explicit = _allowlist_key(host, port if port is not None else DEFAULT_PORTS[scheme])
    bare = _allowlist_key(host, None)
    if explicit in allowed:
        return explicit
    if bare in allowed and port in (None, DEFAULT_PORTS[scheme]):
        return bare
    raise WebhookRefused(f"host {explicit!r} is not in AGENTRUNS['WEBHOOK_ALLOWLIST']; not sent")


def connection_for(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An unopened connection to ``url``'s host and the path (with query) to request."""
    parts = urlsplit(url)
    connection_class = (
        http.client.HTTPSConnection
        if parts.scheme.lower() == "https"
        else http.client.HTTPConnection
    )
    # No proxies, no redirects: the allowlist names where the bytes go.
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return connection, path


@dataclass(frozen=True)
class PostAnswer:
    status: int
    body: str


def post_json(
    url: str, payload: Any, *, allowlist: list[str], timeout: float, headers: dict | None = None
) -> PostAnswer:
    """POST ``payload`` as JSON to ``url`` after checking it against ``allowlist``.

    Raises ``WebhookRefused`` (nothing sent), ``OSError`` / ``http.client.HTTPException`` (no
    connection, a timeout, a broken answer). Any HTTP status is an answer; the caller judges it.
    """
    webhook_target(url, allowlist)
    connection, path = connection_for(url, timeout)
    try:
        connection.request(
            "POST",
            path,
            body=json.dumps(payload).encode("utf-8"),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        response = connection.getresponse()
        raw = response.read(BODY_CHARS * 4)
    finally:
        connection.close()
    return PostAnswer(response.status, raw.decode("utf-8", errors="replace")[:BODY_CHARS])
