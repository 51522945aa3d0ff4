"""What an MCP server sends over HTTP, made readable before the SDK parses it (docs/design.md
§4.1, §4.5).

JSON text may hold the escape of a lone surrogate (``"\\ud800"``): grammatical JSON, but not
Unicode. Python's ``json`` reads it; the SDK's parser (pydantic's) refuses the whole message, so
the answer to a call that ran would be lost. ``MendingTransport`` wraps the HTTP client's
transport and rewrites each such escape in a response as ``\\ufffd`` (U+FFFD, the same six
bytes: the body's length does not change), counting them in ``Mends``: a call whose answer
was mended says so (``call_remote_tool`` marks its result ``text``). Valid pairs, escaped
backslashes and compressed bodies are left as they are. Stdio needs none of this: Leasehold
reads its lines itself (``mcp_stdio``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx2

# An escape ``\uD800``–``\uDFFF`` preceded by an even number of backslashes (so it is an escape,
# not an escaped backslash and a "u"): a high one with its low partner is a valid pair (kept);
# a high one alone, or a low one alone, is lone.
_ESCAPE = re.compile(
    rb"(?<!\\)((?:\\\\)*)\\u(?:(d[89ab][0-9a-f]{2})(\\ud[c-f][0-9a-f]{2})?|d[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)
_REPLACEMENT = rb"\ufffd"


class Mends:
    """How many lone surrogates' escapes were rewritten so far (written by the session's
    thread, read by the caller's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self, count: int) -> None:
        with self._lock:
            self._count += count

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


def mend_line(line: bytes) -> tuple[bytes, int]:
    """``line`` (JSON text) with every lone surrogate's escape rewritten as ``\\ufffd``, and how
    many there were."""
    if b"\\u" not in line and b"\\U" not in line:
        return line, 0
    count = 0

    def rewrite(match: re.Match[bytes]) -> bytes:
        nonlocal count
        if match.group(2) is not None and match.group(3) is not None:
            return match.group(0)  # a valid pair
        count += 1
        return match.group(1) + _REPLACEMENT

    return _ESCAPE.sub(rewrite, line), count


class _MendingStream(httpx2.AsyncByteStream):
    """The body, line by line (JSON text holds no raw newline inside a string, so an escape is
    never split), each line mended."""

    def __init__(self, inner: Any, mends: Mends) -> None:
        self._inner = inner
        self._mends = mends

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parts: list[bytes] = []  # the line begun, joined once it ends (never copied per chunk)
        async for chunk in self._inner:
            if b"\n" not in chunk:
                parts.append(chunk)
                continue
            head, _, tail = chunk.rpartition(b"\n")
            parts.append(head + b"\n")
            yield self._mended(b"".join(parts))
            parts = [tail] if tail else []
        if parts:
            yield self._mended(b"".join(parts))

    def _mended(self, data: bytes) -> bytes:
        mended, count = mend_line(data)
        if count:
            self._mends.add(count)
        return mended

    async def aclose(self) -> None:
        await self._inner.aclose()


class MendingTransport(httpx2.AsyncBaseTransport):
    """``inner`` (by default the client's usual transport), with each response body mended."""

    def __init__(self, mends: Mends, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.mends = mends
        self._inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            return response  # compressed: the escapes are not visible in these bytes
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_MendingStream(response.stream, self.mends),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()
