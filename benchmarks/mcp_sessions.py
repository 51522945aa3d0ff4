#!/usr/bin/env python
"""Remote calls per second for a turn of 5 calls to ``mcp-server-time`` over stdio (issue 16 §3),
and how long a timed-out call takes to come back (§2).

Runs real runs on a throwaway SQLite database (the scripted provider; the server is the PyPI
``mcp-server-time`` of the ``dev`` extra, started with this interpreter) and prints, in the same
run:

* ``before``: every call opens its own session — a fresh server process per call (what Leasehold
  did before one session per segment; here the segment's session scope is switched off);
* ``after``: the segment keeps one session per server for its calls.

Each figure is calls/s over the turn's 5 calls (the whole run's wall time: the provider is
scripted, so the time is the remote calls'), the median of ``--runs`` runs. Then a call to the
project's own stalling stdio test server with ``timeout_seconds`` of 5: the time until the caller
has its answer (the configured timeout plus the abort; the issue allows 1 s over), beside the
same call made as before (the SDK's stdio client under ``anyio.fail_after``).

    .venv/bin/python benchmarks/mcp_sessions.py [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CALLS = 5


@contextlib.contextmanager
def no_scope() -> Iterator[None]:
    """The segment without its session scope: every call opens and closes its own session."""
    from agentruns.services.runtime import segment

    @contextlib.contextmanager
    def nothing() -> Iterator[None]:
        yield None

    original = segment.session_scope
    segment.session_scope = nothing  # type: ignore[assignment]
    try:
        yield
    finally:
        segment.session_scope = original


def turn_seconds(configuration: object) -> float:
    from agentruns.models import Status
    from agentruns.services import runs

    started = time.perf_counter()
    run = runs.run_start_sync(configuration=configuration, prompt="what time is it?").run
    elapsed = time.perf_counter() - started
    if run.status != Status.COMPLETED:
        sys.exit(f"the benchmark run ended {run.status}: {run.error}")
    return elapsed


def measure(runs_each: int) -> None:
    from agentruns.models import AgentConfiguration, AgentRunEvent, EventKind, McpServer
    from agentruns.services.mcp_sync import mcp_server_sync

    command = shlex.join([sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])
    row = McpServer.objects.create(
        name="time",
        transport="stdio",
        command=command,
        timeout_seconds=30,
        read_only_tools=["get_current_time"],
    )
    synced = mcp_server_sync(server=row)
    if not synced.ok:
        sys.exit(f"mcp-server-time did not sync: {synced.error}")
    zones = ["UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York", "Australia/Sydney"]
    calls = [
        {"name": "mcp__time__get_current_time", "arguments": {"timezone": zone}}
        for zone in zones[:CALLS]
    ]
    configuration = AgentConfiguration.objects.create(
        slug="mcp-bench",
        name="mcp bench",
        script=[{"tool_calls": calls}, {"content": "done"}],
        tools=[],
    )
    turn_seconds(configuration)  # warm the interpreter's imports once
    with no_scope():
        before = [turn_seconds(configuration) for _ in range(runs_each)]
    after = [turn_seconds(configuration) for _ in range(runs_each)]
    failed = AgentRunEvent.objects.filter(kind=EventKind.TOOL, payload__ok=False).count()
    if failed:
        sys.exit(f"{failed} remote calls failed")
    b, a = statistics.median(before), statistics.median(after)
    print(f"a turn of {CALLS} calls to mcp-server-time over stdio ({runs_each} runs each, median)")
    print(f"  before (a server process per call): {b:6.2f} s  {CALLS / b:6.2f} calls/s")
    print(f"  after  (one session per segment):   {a:6.2f} s  {CALLS / a:6.2f} calls/s")
    print(f"  speed-up: {b / a:.1f}x")


def measure_timeout() -> None:
    from uuid import uuid4

    from agentruns.models import McpServer
    from agentruns.tools import OutcomeUnknown, ToolContext
    from agentruns.tools.mcp_client import call_remote_tool
    from agentruns.tools.mcp_sessions import session_scope
    from tests.support.mcp_stdio_server import stdio_command

    row = McpServer(name="stall", transport="stdio", command=stdio_command(), timeout_seconds=5)
    context = ToolContext(
        run_uuid=uuid4(), call_id="c1", initiator_id=None, fencing_token=1, timeout_seconds=60
    )

    def stalled() -> float:
        started = time.perf_counter()
        try:
            call_remote_tool(row, "commit_and_stall", {"message": "m"}, context)
        except OutcomeUnknown:
            return time.perf_counter() - started
        sys.exit("the stalling call answered")

    with session_scope():
        call_remote_tool(row, "echo", {"text": "open the session"}, context)
        shared = stalled()
    own = stalled()
    sdk = sdk_stalled(row.command, 5.0)
    print("a stalled call with timeout_seconds=5 came back (outcome unknown) after")
    print(
        f"  {sdk:.2f} s before: the SDK's stdio client under anyio.fail_after (its shutdown after)"
    )
    print(f"  {shared:.2f} s on the segment's open session")
    print(f"  {own:.2f} s opening its own session (start, call, stop all inside the timeout)")


def sdk_stalled(command: str, limit: float) -> float:
    """The baseline: how Leasehold called before — the SDK's own stdio client inside
    ``anyio.fail_after(limit)``, whose shutdown (grace, SIGTERM, SIGKILL) runs after it."""
    import asyncio

    import anyio
    from mcp import Client, StdioServerParameters

    argv = shlex.split(command)

    async def call() -> None:
        with anyio.fail_after(limit):
            params = StdioServerParameters(command=argv[0], args=argv[1:])
            async with Client(params, read_timeout_seconds=limit, cache=None) as client:
                await client.call_tool("commit_and_stall", {"message": "m"})

    started = time.perf_counter()
    with contextlib.suppress(Exception):  # the timeout, however the SDK words it
        asyncio.run(call())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="leasehold-mcp-")
    try:
        from benchmarks._support import setup_django

        setup_django(
            {
                "DATABASE_URL": f"sqlite:///{os.path.join(directory, 'bench.sqlite3')}",
                "DJANGO_SETTINGS_MODULE": "config.settings.local",
                "LOG_LEVEL": "ERROR",
                "AGENTRUNS_MCP_STDIO_ALLOWED": "true",
            }
        )
        measure(args.runs)
        measure_timeout()
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
