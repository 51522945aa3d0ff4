"""A real MCP server (the ``mcp`` SDK's ``MCPServer``) over stdio, for remote-tool tests.

Run as a script: ``python tests/support/mcp_stdio_server.py [CALL_LOG]``. It imports neither
Django nor the project, so the client can start it with a bare environment. Tools (the same
names as ``tests.support.mcp_server.TicketServer``):

* ``create_ticket(title)`` — returns ``{"ticket": n, "title": title, "meta": <the request's
  _meta>}``, so a test sees the idempotency key the client sent in the tool event's result. It
  claims to be read-only and idempotent (hints must decide nothing).
* ``echo(text)`` — returns the text.
* ``fail()`` — answers with ``isError``.
* ``commit_and_stall(message)`` — records the call (the effect landed), then never answers
  (sleeps ``STALL_SECONDS``): a timeout after the call was sent.
* ``commit_and_vanish(message)`` — records the call, says so on stderr and exits at once: the
  connection is lost after the call was sent.

``--refuse MESSAGE`` as the first argument: print MESSAGE on stderr and exit 2 before speaking
MCP (a server started with a bad argument). Every recorded call carries the server's ``pid``.

``--hostile`` as the first argument adds tools whose results no column can store (``HOSTILE``:
``hostile_text(kind)`` and ``hostile_structured(kind)``, recorded like the others), and writes
what the SDK would send through ``raw_wire``: the sentinels ``"__NaN__"``, ``"__Infinity__"``,
``"__-Infinity__"`` become the JSON text ``NaN`` / ``Infinity`` / ``-Infinity``, ``__LONE__``
inside a string the escape of a lone surrogate (``\\ud800``) and ``__BROKEN__`` the escape
``\\x``, which is not JSON at all: bytes no SDK writes, which a hostile server sends.

With ``CALL_LOG`` every tool call appends one JSON line (``{"tool", "arguments", "meta"}``)
to that file, so a test can count the calls that reached the process. ``STDIO_COMMAND`` is
the ``McpServer.command`` that starts it with the running interpreter.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

SCRIPT = Path(__file__).resolve()
STALL_SECONDS = 120

#: What ``hostile(kind)`` returns (``text``: one text block; the others: structured content),
#: before ``raw_wire`` rewrites the sentinels.
HOSTILE: dict[str, Any] = {
    "nul_text": "before \x00 after",
    "surrogate": {"value": "a__LONE__b", "list": ["__LONE__"]},
    "nan": {"value": "__NaN__", "list": ["__Infinity__", "__-Infinity__", 1.5]},
    "huge": "x" * 3_000_000,
    "broken": {"value": "a__BROKEN__b"},
}
_RAW = {
    '"__NaN__"': "NaN",
    '"__Infinity__"': "Infinity",
    '"__-Infinity__"': "-Infinity",
    "__LONE__": "\\ud800",
    "__BROKEN__": "\\x",  # an escape JSON does not have: no parser reads the answer
}


def raw_wire(text: str) -> str:
    """``text`` (JSON the SDK wrote) with the sentinels replaced by what a hostile server sends."""
    for sentinel, raw in _RAW.items():
        text = text.replace(sentinel, raw)
    return text


def stdio_command(
    call_log: Path | None = None, *, refuse: str | None = None, hostile: bool = False
) -> str:
    """The ``McpServer.command`` that starts this server with the current interpreter."""
    argv = [sys.executable, str(SCRIPT)]
    if refuse is not None:
        argv += ["--refuse", refuse]
    if hostile:
        argv += ["--hostile"]
    argv += [str(call_log)] if call_log else []
    return shlex.join(argv)


def read_calls(call_log: Path) -> list[dict[str, Any]]:
    """The calls recorded in ``call_log`` (none when the file does not exist)."""
    if not call_log.exists():
        return []
    return [json.loads(line) for line in call_log.read_text().splitlines() if line.strip()]


def build(call_log: Path | None, *, hostile: bool = False) -> Any:
    server = MCPServer("tickets-stdio", log_level="WARNING")
    tickets: list[str] = []

    def record(tool: str, arguments: dict[str, Any], ctx: Any) -> dict[str, Any]:
        meta = dict(ctx.request_context.meta or {})
        if call_log is not None:
            with call_log.open("a") as out:
                line = {"tool": tool, "arguments": arguments, "meta": meta, "pid": os.getpid()}
                out.write(json.dumps(line) + "\n")
        return meta

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=True, idempotent_hint=True, destructive_hint=False
        )
    )
    def create_ticket(title: str, ctx: Context) -> dict[str, Any]:
        """Open a ticket with a title."""
        meta = record("create_ticket", {"title": title}, ctx)
        tickets.append(title)
        return {"ticket": len(tickets), "title": title, "meta": meta}

    @server.tool()
    def echo(text: str, ctx: Context) -> str:
        """Return the text."""
        record("echo", {"text": text}, ctx)
        return text

    @server.tool()
    def fail(ctx: Context) -> str:
        """Always fails."""
        record("fail", {}, ctx)
        raise ToolError("the ticket system is read-only today")

    @server.tool()
    def commit_and_stall(message: str, ctx: Context) -> str:
        """Commit, then take very long to answer."""
        record("commit_and_stall", {"message": message}, ctx)
        time.sleep(STALL_SECONDS)
        return "committed"

    @server.tool()
    def commit_and_vanish(message: str, ctx: Context) -> str:
        """Commit, then drop the connection."""
        record("commit_and_vanish", {"message": message}, ctx)
        print("fatal: lost my marbles after committing", file=sys.stderr, flush=True)
        os._exit(3)

    if hostile:

        @server.tool()
        def hostile_text(kind: str, ctx: Context) -> str:
            """Returns a text no column can store."""
            record("hostile_text", {"kind": kind}, ctx)
            return str(HOSTILE[kind])

        @server.tool()
        def hostile_structured(kind: str, ctx: Context) -> dict[str, Any]:
            """Returns structured content no column can store."""
            record("hostile_structured", {"kind": kind}, ctx)
            return dict(HOSTILE[kind])

    return server


class RawStdout:
    """The server's stdout, written as a hostile server would (``raw_wire``)."""

    async def write(self, text: str) -> None:
        sys.stdout.buffer.write(raw_wire(text).encode("utf-8"))

    async def flush(self) -> None:
        sys.stdout.buffer.flush()


async def serve_raw(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    low = server._lowlevel_server
    async with stdio_server(stdout=RawStdout()) as (read_stream, write_stream):  # type: ignore[arg-type]
        await low.run(read_stream, write_stream, low.create_initialization_options())


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--refuse"]:
        print("starting the tickets server", file=sys.stderr)
        print(args[1], file=sys.stderr, flush=True)
        sys.exit(2)
    if args[:1] == ["--hostile"]:
        import anyio

        args = args[1:]
        anyio.run(serve_raw, build(Path(args[0]) if args else None, hostile=True))
    else:
        build(Path(args[0]) if args else None).run("stdio")
