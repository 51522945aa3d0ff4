"""A remote (MCP) tool's result that no column can store never strands a run (docs/design.md
§4.1, §4.5), against real local MCP servers that put hostile bytes on the wire
(``tests.support.mcp_server.TicketServer(hostile=True)`` over streamable HTTP, and
``tests/support/mcp_stdio_server.py --hostile`` over stdio): text content holding ``\\u0000``,
structured content holding the JSON text ``NaN`` / ``Infinity`` or a lone surrogate's escape
(``\\ud800``, which the SDK's own parser refuses: Leasehold reads it, over HTTP through
``mcp_wire.MendingTransport``, over stdio in its own transport), and a result of several
megabytes.

A read (listed in the row's ``read_only_tools``) and an approved non-idempotent write each run
once on the server, the run completes, and the ``tool`` event stores the result mended and
marked. An answer no parser reads (an escape JSON does not have) leaves unknown whether the server
answered with a result or an error: a read gets an error result, a write waits for reconciliation
(never sent again). Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns import audit
from agentruns.models import AgentRun, EventKind, McpServer, McpTransport, Status
from agentruns.services import runs
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.services.runtime.transcript import tool_message_content
from agentruns.storable import REPLACEMENT
from agentruns.tools.invocation import MAX_RESULT_CHARS
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    decide_inline,
    decider,
    events,
    sent,
    tool_messages,
)
from tests.support.mcp_server import TicketServer, server_row
from tests.support.mcp_stdio_server import HOSTILE, read_calls, stdio_command

pytestmark = pytest.mark.django_db


R = REPLACEMENT
HOSTILE_TOOLS = ["hostile_text", "hostile_structured"]
EFFECTS = ["read", "write"]

stdio_allowed = override_settings(AGENTRUNS={**settings.AGENTRUNS, "MCP_STDIO_ALLOWED": True})


def http_row(server: TicketServer, effect: str) -> McpServer:
    read_only = HOSTILE_TOOLS if effect == "read" else []
    row: McpServer = server_row(server, name="tix", read_only_tools=read_only)
    return row


def stdio_row(call_log: Path, effect: str) -> McpServer:
    row = McpServer.objects.create(
        name="local",
        transport=McpTransport.STDIO,
        command=stdio_command(call_log, hostile=True),
        timeout_seconds=30,
        read_only_tools=HOSTILE_TOOLS if effect == "read" else [],
    )
    assert mcp_server_sync(server=row).ok
    return row


def run_call(row: McpServer, tool: str, kind: str) -> AgentRun:
    """A run whose model calls ``tool(kind)`` on ``row`` once, then answers "done"; a write is
    approved inline."""
    name = f"mcp__{row.name}__{tool}"
    script = [
        {"tool_calls": [{"name": name, "arguments": {"kind": kind}}]},
        {"content": "done"},
    ]
    run = runs.run_start_sync(
        configuration=AgentConfigurationFactory(script=script), prompt="go"
    ).run
    if run.status == Status.WAITING_FOR_APPROVAL:
        run = decide_inline(run).run
    return AgentRun.objects.get(pk=run.pk)


def completed_with_one_tool_event(run: AgentRun) -> dict[str, Any]:
    """Completed, released, ledger intact, nothing in doubt; the model read what is stored."""
    assert (run.status, run.output) == (Status.COMPLETED, "done"), run.error
    stream = assert_contiguous(run)
    assert not {EventKind.IN_DOUBT, EventKind.REAPER, EventKind.ERROR} & {e.kind for e in stream}
    assert run.requeue_count == 0
    assert_released(run)
    assert audit.verify(run_uuid=run.uuid).intact
    (tool,) = [e.payload for e in stream if e.kind == EventKind.TOOL]
    assert tool["outcome"] == "executed"
    assert tool_messages(sent(run)[-1])[tool["call_id"]] == tool_message_content(tool)
    return tool


def huge_and_cut(result: Any) -> bool:
    text = HOSTILE["huge"]
    return (
        isinstance(result, str)
        and result.startswith('{"content":[{"type":"text","text":"xxxxxxxx')
        and "characters of JSON; the beginning is kept]" in result
        and 2 * len(text)
        < int(result.split("[cut for storage: ")[1].split(" ")[0].replace(",", ""))
        and len(json.dumps(result, ensure_ascii=False)) <= MAX_RESULT_CHARS
    )


# Each: the tool, its kind, whether the stored result is as expected, the marks.
MENDED: dict[str, tuple[str, str, Any, list[str]]] = {
    "nul-text": (
        "hostile_text",
        "nul_text",
        lambda result: result["content"] == [{"type": "text", "text": f"before {R} after"}],
        ["text"],
    ),
    "nan-structured": (
        "hostile_structured",
        "nan",
        lambda result: (
            result["structuredContent"] == {"value": "NaN", "list": ["Infinity", "-Infinity", 1.5]}
        ),
        ["number"],
    ),
    "surrogate-structured": (
        "hostile_structured",
        "surrogate",
        lambda result: (
            result["structuredContent"] == {"value": f"a{R}b", "list": [R]}
            and f'"a{R}b"' in result["content"][0]["text"]
        ),
        ["text"],
    ),
    "huge": ("hostile_text", "huge", huge_and_cut, ["size"]),
}


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("case", list(MENDED))
def test_a_remote_result_no_column_can_store_is_mended_and_marked(
    hostile_mcp_server, scripted_recordings, case, effect
):
    tool_name, kind, as_stored, marks = MENDED[case]
    row = http_row(hostile_mcp_server, effect)

    run = run_call(row, tool_name, kind)

    tool = completed_with_one_tool_event(run)
    assert tool["ok"] is True and tool["effect"] == (
        "read" if effect == "read" else "non_idempotent_write"
    )
    assert as_stored(tool["result"]), str(tool["result"])[:300]
    assert tool["normalised"] == marks
    assert [c.arguments for c in hostile_mcp_server.tool_calls(tool_name)] == [{"kind": kind}]


def test_a_remote_read_whose_answer_cannot_be_read_is_an_error_the_model_reads(
    hostile_mcp_server, scripted_recordings
):
    row = http_row(hostile_mcp_server, "read")

    run = run_call(row, "hostile_structured", "broken")

    tool = completed_with_one_tool_event(run)
    assert tool["ok"] is False
    assert "the server answered, but its answer could not be read" in tool["error"]
    assert "whether it took effect is unknown" in tool["error"]
    assert len(hostile_mcp_server.tool_calls("hostile_structured")) == 1


def test_a_remote_write_whose_answer_cannot_be_read_waits_for_reconciliation_never_resent(
    hostile_mcp_server,
):
    row = http_row(hostile_mcp_server, "write")

    run = run_call(row, "hostile_structured", "broken")

    assert run.status == Status.WAITING_FOR_RECONCILIATION
    (doubt,) = [e.payload for e in events(run) if e.kind == EventKind.IN_DOUBT]
    assert "its answer could not be read" in doubt["error"]
    assert not [e for e in events(run) if e.kind == EventKind.TOOL]
    runs.run_reconcile(
        run_uuid=run.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=card_digest(run),  # the digest a person is shown and sends
        mode="inline",
    )
    run.refresh_from_db()
    assert (run.status, run.output) == (Status.COMPLETED, "done")
    assert len(hostile_mcp_server.tool_calls("hostile_structured")) == 1
    assert_released(run)
    assert audit.verify(run_uuid=run.uuid).intact


# --- over stdio, whose messages Leasehold reads itself -------------------------------------------

STDIO = {case: MENDED[case] for case in ("surrogate-structured", "nan-structured")}


@stdio_allowed
@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("case", list(STDIO))
def test_a_stdio_result_no_column_can_store_is_read_mended_and_marked(
    tmp_path, scripted_recordings, case, effect
):
    tool_name, kind, as_stored, marks = STDIO[case]
    call_log = tmp_path / "calls.jsonl"
    row = stdio_row(call_log, effect)

    run = run_call(row, tool_name, kind)

    tool = completed_with_one_tool_event(run)
    assert tool["ok"] is True
    assert as_stored(tool["result"]), str(tool["result"])[:300]
    assert tool["normalised"] == marks
    assert [c["arguments"] for c in read_calls(call_log)] == [{"kind": kind}]
