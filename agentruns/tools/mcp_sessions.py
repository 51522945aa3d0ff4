"""Open MCP sessions and the segment scope that shares them (docs/design.md §4.5).

A ``RemoteSession`` is one open connection to one server, owned by a thread of its own that runs
the SDK's event loop; the caller's thread waits on it with a deadline. When the deadline passes
the session is aborted (a stdio server's process group is killed at once) and the caller returns
within ``ABORT_SECONDS`` — the configured timeout is the whole call, shutdown included, whatever
the SDK's own shutdown would wait.

A ``SessionScope`` keeps one session per server for the tool calls of one segment: opened on
first use, closed when the segment ends or learns its lease is lost; a session whose server
crashed is restarted once per scope. A closed scope opens nothing: a segment that lost its lease
sends nothing more. Outside a scope every call opens and closes its own session.

It never stamps, checks or clears a lease or a fence, and writes no rows.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

from agentruns.tools.mcp_stdio import StdioProcess
from agentruns.tools.mcp_wire import Mends

ABORT_SECONDS = 0.7  # what a timed-out call may add to its timeout: kill, then join the thread
CLOSE_SECONDS = 0.7  # a normal close: the transport's own bounded stop, then the thread is left

Connect = Callable[[], AbstractAsyncContextManager[Any]]


class SessionOpenFailed(Exception):
    """The session could not be opened (the server did not start, or did not initialize): no
    tool call was sent. ``__cause__`` holds the error; ``stderr`` the server's last words."""

    def __init__(self, message: str, *, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


class SessionTimedOut(Exception):
    """The deadline passed while the session was busy; it was aborted."""


class ScopeClosed(Exception):
    """The scope was closed (its segment ended or lost its lease): nothing is opened or sent."""


class RemoteSession:
    """One connection to one server, opened by ``open`` and served by its own thread.

    ``process`` is set for stdio servers (the transport fills in the pid and the stderr tail);
    ``mends`` for HTTP servers (how many lone surrogates' escapes its answers held so far).
    """

    def __init__(
        self, connect: Connect, *, process: StdioProcess | None = None, mends: Mends | None = None
    ) -> None:
        self._connect = connect
        self.process = process
        self.mends = mends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Event | None = None
        self._client: Any = None
        self._opened = False
        self._aborted = False
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def open(self, deadline: float) -> None:
        """Start the server (stdio) or connect (HTTP) and initialize, by ``deadline``
        (``time.monotonic()``). Raises ``SessionOpenFailed``: nothing was sent."""
        self._thread = threading.Thread(target=self._serve, name="mcp-session", daemon=True)
        self._thread.start()
        if not self._ready.wait(max(0.0, deadline - time.monotonic())):
            self.abort()
            raise SessionOpenFailed(
                "the server did not start and initialize in time", **self._words()
            )
        if not self._opened:
            error = self._error or RuntimeError("the session ended while opening")
            self.close()
            raise SessionOpenFailed(_one_line(error), **self._words()) from error

    def _words(self) -> dict[str, str]:
        return {"stderr": self.stderr()}

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # the thread's own end; recorded for the opener
            self._error = self._error or exc
        finally:
            self._ended.set()
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = asyncio.Event()
        try:
            async with self._connect() as client:
                self._client = client
                self._opened = True
                self._ready.set()
                await self._closing.wait()
        except BaseException as exc:
            self._error = exc

    @property
    def alive(self) -> bool:
        """Open and usable as far as can be seen without sending anything."""
        if not self._opened or self._aborted or self._ended.is_set():
            return False
        return not (self.process is not None and self.process.ended.is_set())

    def stderr(self) -> str:
        return self.process.stderr.text() if self.process is not None else ""

    def close(self, *, wait: float = CLOSE_SECONDS) -> None:
        """Ask the session to end and wait up to ``wait`` seconds; a stdio server that is still
        there then is killed. Never raises; safe to call twice."""
        loop, closing = self._loop, self._closing
        if loop is not None and closing is not None and not self._ended.is_set():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(closing.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)
        if self.process is not None and not self._ended.is_set():
            self.process.kill()

    def abort(self) -> None:
        """End the session now: a stdio server's group is killed first (its call cannot finish),
        then ``close`` with what ``ABORT_SECONDS`` allows. It is never used again."""
        self._aborted = True
        if self.process is not None:
            self.process.kill()
        self.close(wait=ABORT_SECONDS)

    # -- requests --

    def request(self, make: Callable[[Any], Coroutine[Any, Any, Any]], deadline: float) -> Any:
        """Run ``make(client)`` on the session's loop and wait until ``deadline``. Raises
        ``SessionTimedOut`` (the session was aborted) or what the request raised."""
        loop = self._loop
        if loop is None or not self.alive:
            raise SessionOpenFailed("the session is not open")
        future = asyncio.run_coroutine_threadsafe(make(self._client), loop)
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            future.cancel()
            self.abort()
            raise SessionTimedOut() from None
        except concurrent.futures.CancelledError:
            raise SessionTimedOut() from None


def _one_line(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


# --- The scope of a segment --------------------------------------------------------------------


class SessionScope:
    """The sessions of one segment, one per server key; restarted once after a crash."""

    RESTARTS = 1

    def __init__(self) -> None:
        self._sessions: dict[Any, RemoteSession] = {}
        self._restarts: dict[Any, int] = {}
        self._lock = threading.Lock()
        self.closed = False
        self.opened = 0  # sessions opened in this scope (a figure for tests and benchmarks)

    def session(
        self, key: Any, factory: Callable[[], RemoteSession], deadline: float
    ) -> RemoteSession:
        """The open session for ``key``, opened now when there is none; a dead one (its server
        crashed, or a timed-out call aborted it) is replaced once. Raises ``ScopeClosed`` or
        ``SessionOpenFailed`` (nothing sent)."""
        with self._lock:
            if self.closed:
                raise ScopeClosed()
            current = self._sessions.get(key)
            if current is not None and current.alive:
                return current
            if current is not None:
                current.close(wait=0)
                del self._sessions[key]
                used = self._restarts.get(key, 0)
                if used >= self.RESTARTS:
                    raise SessionOpenFailed(
                        "the server's session ended twice in this segment; not restarted again",
                        stderr=current.stderr(),
                    )
                self._restarts[key] = used + 1
            fresh = factory()
            fresh.open(deadline)
            self.opened += 1
            self._sessions[key] = fresh
            return fresh

    def close(self) -> None:
        """Close every session and refuse new ones (idempotent)."""
        with self._lock:
            self.closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()


_current: ContextVar[SessionScope | None] = ContextVar("mcp_session_scope", default=None)


@contextmanager
def session_scope() -> Iterator[SessionScope]:
    """Share one session per server among the tool calls made inside (this thread's context);
    every session is closed on the way out."""
    scope = SessionScope()
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)
        scope.close()


def current_scope() -> SessionScope | None:
    return _current.get()
