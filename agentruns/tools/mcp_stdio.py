"""Leasehold's stdio transport for MCP servers (docs/design.md §4.5): the SDK's framing (one
JSON-RPC message per line on stdin/stdout), Leasehold's own process lifecycle.

Owns the server process: it starts it in a new session (its own process group), keeps the last
lines of its stderr in a bounded ``StderrTail`` (a server's own reason for failing: "repository
does not exist"), says when its stdout ended (the process died or closed it: ``ended``) and stops
it within a bounded time: stdin closed, ``GRACE_SECONDS`` to exit, then SIGKILL to the group.
On Linux the server also gets SIGKILL when the thread that started it dies (``PR_SET_PDEATHSIG``):
a killed worker leaves no server behind.
``kill()`` stops it at once, from any thread: how a caller whose time ran out keeps its own
timeout (the SDK's stdio shutdown waits up to several seconds beyond it).

It knows nothing of runs, leases or fences, and writes no rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

logger = logging.getLogger(__name__)

GRACE_SECONDS = 0.3  # for the server to exit by itself once its stdin closed
REAP_SECONDS = 0.2  # for the event loop to see a killed process go
DRAIN_SECONDS = 0.1  # for the last of its stderr once it is gone
TAIL_LINES = 20
TAIL_LINE_CHARS = 300
TAIL_CHARS = 2000
MAX_LINE_BYTES = 16 * 1024 * 1024  # a stdout line longer than this is a broken server
PR_SET_PDEATHSIG = 1


class StderrTail:
    """The last ``TAIL_LINES`` lines of a process's stderr, each cut at ``TAIL_LINE_CHARS``
    characters; thread-safe. ``text()`` joins them, at most ``TAIL_CHARS`` characters (the end
    kept)."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._lock = threading.Lock()

    def feed(self, chunk: str) -> None:
        with self._lock:
            text = self._partial + chunk
            *complete, self._partial = text.split("\n")
            self._partial = self._partial[-TAIL_LINE_CHARS:]
            for line in complete:
                self._add(line)

    def _add(self, line: str) -> None:
        line = line.rstrip("\r").rstrip()
        if line:
            cut = line if len(line) <= TAIL_LINE_CHARS else line[: TAIL_LINE_CHARS - 1] + "…"
            self._lines.append(cut)

    def text(self) -> str:
        with self._lock:
            lines = [*self._lines, *([self._partial.strip()] if self._partial.strip() else [])]
        joined = " | ".join(lines)
        return joined if len(joined) <= TAIL_CHARS else "…" + joined[-(TAIL_CHARS - 1) :]


class StdioProcess:
    """What the transport shares with the thread that owns the session: the process id (once
    started), whether its stdout ended, and its stderr tail."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.ended = threading.Event()
        self.stderr = StderrTail()

    def kill(self) -> None:
        """SIGKILL the server's process group now (no-op before it started or once gone)."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


def _parse_line(line: str) -> SessionMessage | Exception:
    """One message of the server. JSON text the SDK's parser refuses but Python's reads (a
    lone surrogate's escape, ``"\\ud800"``: not valid Unicode) is read as Python reads it: a tool's
    result holding it is then mended and marked like any other (``tools.invocation``)."""
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        try:
            parsed = json.loads(line)
            message = mcp_types.jsonrpc_message_adapter.validate_python(parsed, by_name=False)
        except (ValueError, RecursionError):
            return exc
    return SessionMessage(message)


def _load_prctl() -> Any:
    """``prctl`` from the C library, looked up once in the parent (nothing is loaded after a
    fork); None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the thread that started it dies — the session's
    thread, so a segment's process that is killed (and so every thread in it) takes its stdio
    servers with it, even one stuck in a tool call. Linux only; elsewhere a server sees its stdin
    close."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


@asynccontextmanager
async def stdio_transport(argv: Sequence[str], state: StdioProcess) -> AsyncIterator[Any]:
    """Start ``argv`` (no shell; the SDK's safe default environment) and yield the (read, write)
    streams an ``mcp.Client`` takes. Raises ``OSError`` when it cannot be started."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=get_default_environment(),
        start_new_session=True,
        preexec_fn=_die_with_parent if _PRCTL is not None else None,
        limit=MAX_LINE_BYTES,
    )
    state.pid = process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        try:
            async with read_writer:
                while True:
                    try:
                        line = await process.stdout.readuntil(b"\n")
                    except asyncio.IncompleteReadError as end:
                        line = end.partial  # the last line without its newline, or nothing
                        if line.strip():
                            await read_writer.send(_parse_line(line.decode("utf-8", "replace")))
                        return
                    except asyncio.LimitOverrunError:
                        await read_writer.send(ValueError("the server sent an endless line"))
                        return
                    if line.strip():
                        await read_writer.send(_parse_line(line.decode("utf-8", "replace")))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            state.ended.set()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.stdin.write((data + "\n").encode("utf-8"))
                    await process.stdin.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end, not a hang

    stderr_done = anyio.Event()

    async def stderr_reader() -> None:
        assert process.stderr is not None
        try:
            with contextlib.suppress(OSError):
                while chunk := await process.stderr.read(4096):
                    state.stderr.feed(chunk.decode("utf-8", "replace"))
        finally:
            stderr_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stdout_reader)
        tasks.start_soon(stdin_writer)
        tasks.start_soon(stderr_reader)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, state)
                with anyio.move_on_after(DRAIN_SECONDS):  # the server's last words
                    await stderr_done.wait()
            tasks.cancel_scope.cancel()


async def _stop(process: Any, state: StdioProcess) -> None:
    """Close stdin, give the server ``GRACE_SECONDS`` to exit, then kill its group: bounded."""
    with contextlib.suppress(OSError, RuntimeError):
        process.stdin.close()
    if not await _exited(process, GRACE_SECONDS):
        state.kill()
        if not await _exited(process, REAP_SECONDS):
            logger.warning("MCP server process %s survived SIGKILL; abandoned", process.pid)


async def _exited(process: Any, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await process.wait()
    return process.returncode is not None
