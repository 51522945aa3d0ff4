"""Where Leasehold may send HTTP requests of its own: the ``WEBHOOK_ALLOWLIST`` rule, one function
for every sender (the playground's ``call_webhook``, a configuration's notification webhook).

Two checks, both before anything is sent:

* the **name** (``webhook_target``): the URL's host, on its port, must be listed — a ``host``
  entry allows the scheme's default port only, ``host:port`` exactly that port (IPv6 as
  ``[::1]:8080``);
* the **address** (``resolve_target``): the name is resolved once per call, and only the
  addresses it resolves to that are public — not loopback, private, link-local, multicast,
  reserved, unspecified or a cloud metadata address (``METADATA_ADDRESSES``) — or that are
  themselves listed as addresses (an IP literal entry, with the same port rule) are kept; none
  kept: refused.

``connection_for`` connects to the kept addresses only (in the resolver's order), never
resolving the name again, while the ``Host`` header and TLS (SNI and the certificate check) use
the name: a DNS answer that changes between the check and the connection (rebinding) cannot move
the request. ``post_json`` POSTs a JSON body with a timeout, no proxy and no redirect. Never reads
the database.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
BODY_CHARS = 2000

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud instance metadata services (AWS, ECS, Azure, GCP, Oracle, Alibaba): refused by name,
# whatever Python's ``ipaddress`` says of their ranges, unless listed as addresses.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.169.253",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "192.0.0.192",
        "100.100.100.200",
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class WebhookRefused(PermissionError):
    """The webhook URL is not allowed; nothing was sent."""


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _normal(host: str) -> str:
    """A host as the allowlist compares it: an IP literal in its canonical form, a name in
    lower case."""
    literal = _literal(host)
    return str(literal) if literal is not None else host.lower()


def _allowlist_key(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _entry_key(entry: str) -> str | None:
    """``entry`` as a key (``host``, ``host:port``, ``[v6]:port``, a bare IPv6 address), or None
    when it is not one."""
    text = entry.strip()
    if not text:
        return None
    port: str | None = None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] or None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text  # a name, an IPv4 address or a bare IPv6 address
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return None
    return _allowlist_key(_normal(host), int(port) if port is not None else None)


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def allowlist_entry_problem(entry: str) -> str | None:
    """Why ``entry`` can never match a webhook URL (``agentruns.E004``), or None when it is a
    ``host``, ``host:port``, an IP address or ``[IPv6]:port`` (what ``webhook_target`` lists)."""
    if any(c.isspace() or ord(c) < 32 for c in entry.strip()) or "/" in entry or "@" in entry:
        return "is not a host (no scheme, path, user or spaces)"
    text = entry.strip()
    if _entry_key(text) is None:
        return "is not host, host:port or [IPv6]:port (a port is 1 to 65535)"
    if text.startswith("["):
        inside = _literal(text[1:].partition("]")[0])
        ok = isinstance(inside, ipaddress.IPv6Address)
        return None if ok else "has brackets around no IPv6 address"
    host = text.partition(":")[0] if text.count(":") == 1 else text
    name = host.rstrip(".")
    if _literal(name) is not None:
        return None
    if not name or len(name) > 253 or not all(map(_HOST_LABEL.fullmatch, name.split("."))):
        return "is not a host name (letters, digits, - and _ in dot-separated labels)"
    return None


def _allowed_keys(allowlist: list[str]) -> set[str]:
    return {key for key in map(_entry_key, allowlist) if key is not None}


def _listed(host: str, port: int, scheme: str, keys: set[str]) -> str | None:
    """The key under which ``host`` on ``port`` is listed, or None."""
    explicit = _allowlist_key(host, port)
    if explicit in keys:
        return explicit
    bare = _allowlist_key(host, None)
    if bare in keys and port == DEFAULT_PORTS[scheme]:
        return bare
    return None


@dataclass(frozen=True)
class _Parsed:
    scheme: str
    host: str  # normalised (``_normal``)
    port: int  # explicit or the scheme's default
    path: str  # with the query


def _parse(url: str) -> _Parsed:
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
        raise WebhookRefused("the URL contains whitespace, control characters or backslashes")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise WebhookRefused(f"only http and https URLs are allowed, not {scheme or 'none'!r}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise WebhookRefused("URLs with user information (user@host) are not allowed")
    host = parts.hostname or ""
    if not host:
        raise WebhookRefused("the URL has no host")
    try:
        port = parts.port
    except ValueError:
        raise WebhookRefused("the URL has an invalid port") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Parsed(scheme, _normal(host), port if port is not None else DEFAULT_PORTS[scheme], path)


def webhook_target(url: str, allowlist: list[str]) -> str:
    """The ``host`` or ``host:port`` that ``url`` would reach, if ``allowlist`` lists it by name.

    Raises ``WebhookRefused`` otherwise: a scheme other than http/https, userinfo
    (``user@host``), no host, a bad port, whitespace/control characters or backslashes, or a
    host not allowed. Case-insensitive; IP literals compare in their canonical form. The name
    only: the addresses it resolves to are ``resolve_target``'s.
    """
    parsed = _parse(url)
    found = _listed(parsed.host, parsed.port, parsed.scheme, _allowed_keys(allowlist))
    if found is None:
        shown = _allowlist_key(parsed.host, parsed.port)
        raise WebhookRefused(f"host {shown!r} is not in AGENTRUNS['WEBHOOK_ALLOWLIST']; not sent")
    return found


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64 or 6to4), or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not public (``"loopback"``, ``"a cloud metadata address"``…), or None.
    An IPv6 address carrying an IPv4 one (mapped, NAT64, 6to4) is judged by that one too."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        problem = address_problem(embedded)
        if problem is not None:
            return problem
    checks = (
        (address in METADATA_ADDRESSES, "a cloud metadata address"),
        (address.is_loopback, "loopback"),
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_unspecified, "unspecified"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
        (not address.is_global, "not globally reachable"),
    )
    return next((reason for failed, reason in checks if failed), None)


def _resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to, in the resolver's order, each once (one lookup)."""
    found: list[IPAddress] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in found:
            found.append(address)
    return found


@dataclass(frozen=True)
class Target:
    """Where one request goes: the URL's ``scheme``, ``host`` (the name, for ``Host`` and TLS),
    ``port`` and ``path``, and the checked ``addresses`` it may connect to (in order)."""

    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]
    allowed_as: str  # the allowlist entry that names the host


def resolve_target(url: str, allowlist: list[str]) -> Target:
    """``url``'s target once both checks passed (see the module docstring): the name is listed
    and it resolves (once, now) to at least one public or listed address.

    Raises ``WebhookRefused`` (nothing sent) when a check fails, ``OSError`` (``socket.gaierror``)
    when the name does not resolve.
    """
    allowed_as = webhook_target(url, allowlist)
    parsed = _parse(url)
    keys = _allowed_keys(allowlist)
    literal = _literal(parsed.host)
    candidates = [literal] if literal is not None else _resolve(parsed.host, parsed.port)
    kept: list[str] = []
    refused: list[tuple[IPAddress, str]] = []
    for address in candidates:
        problem = address_problem(address)
        if problem is None or _listed(str(address), parsed.port, parsed.scheme, keys):
            kept.append(str(address))
        else:
            refused.append((address, problem))
    if not kept:  # an IP literal is listed (the name check): only a name gets here
        found = ", ".join(f"{address} ({problem})" for address, problem in refused)
        raise WebhookRefused(
            f"host {parsed.host!r} resolves only to addresses that are not public: {found}; "
            "such an address is reached only when it is itself in "
            "AGENTRUNS['WEBHOOK_ALLOWLIST']; not sent"
        )
    return Target(
        scheme=parsed.scheme,
        host=parsed.host,
        port=parsed.port,
        path=parsed.path,
        addresses=tuple(kept),
        allowed_as=allowed_as,
    )


def _connect_to(addresses: tuple[str, ...], port: int, timeout: Any, source: Any) -> socket.socket:
    """A socket to the first of ``addresses`` that answers (no name is resolved)."""
    last: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout, source)
        except OSError as exc:
            last = exc
    raise last if last is not None else OSError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._create_connection = lambda address, timeout, source=None: _connect_to(
            target.addresses, address[1], timeout, source
        )


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._create_connection = lambda address, timeout, source=None: _connect_to(
            target.addresses, address[1], timeout, source
        )


def connection_for(target: Target, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An unopened connection to ``target``'s checked addresses and the path (with query) to
    request. ``Host`` and, for https, SNI and the certificate check use ``target.host``. No
    proxies, no redirects: the allowlist names where the bytes go."""
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    return connection_class(target, timeout), target.path


@dataclass(frozen=True)
class PostAnswer:
    status: int
    body: str


def post_json(
    url: str, payload: Any, *, allowlist: list[str], timeout: float, headers: dict | None = None
) -> PostAnswer:
    """POST ``payload`` as JSON to ``url`` after ``resolve_target`` checked it.

    Raises ``WebhookRefused`` (nothing sent), ``OSError`` / ``http.client.HTTPException`` (no
    such name, no connection, a timeout, a broken answer). Any HTTP status is an answer; the
    caller judges it.
    """
    connection, path = connection_for(resolve_target(url, allowlist), timeout)
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
