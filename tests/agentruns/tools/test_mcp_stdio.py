"""Remote tools over MCP against a real local stdio MCP server (docs/design.md §4.5; stdio allowed).

The server is ``tests/support/mcp_stdio_server.py``, started by the SDK's stdio client as a
child process for every listing and every call (``McpServer.command``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from agentruns.models import AgentRunEvent, Effect, EventKind, McpServer, McpTransport, Status
from agentruns.services import runs
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.transcript import request_messages
from agentruns.tools import registry
from tests.agentruns.factories import AgentConfigurationFactory
from tests.support.mcp_stdio_server import read_calls, stdio_command

SERVER = "local"
TICKET = f"mcp__{SERVER}__create_ticket"

stdio_allowed = override_settings(AGENTRUNS={**settings.AGENTRUNS, "MCP_STDIO_ALLOWED": True})


def stdio_server(call_log: Path, **fields: Any) -> McpServer:
    return McpServer.objects.create(
        name=SERVER,
        transport=McpTransport.STDIO,
        command=stdio_command(call_log),
        timeout_seconds=fields.pop("timeout_seconds", 30),
        **fields,
    )


@pytest.mark.django_db
@stdio_allowed
def test_sync_discovers_the_tools_of_a_stdio_server(tmp_path: Path) -> None:
    call_log = tmp_path / "calls.jsonl"
    row = stdio_server(call_log, requires_approval=False)

    result = mcp_server_sync(server=row)
    assert result.ok and result.server_name == SERVER
    snapshot = result.snapshot
    row.refresh_from_db()
    assert row.last_synced_at is not None and row.last_sync_error == ""
    assert row.tools_snapshot == snapshot
    by_name = {e["name"]: e for e in snapshot}
    assert set(by_name) == {
        "create_ticket",
        "echo",
        "fail",
        "commit_and_stall",
        "commit_and_vanish",
    }
    entry = by_name["create_ticket"]
    assert entry["registered_name"] == TICKET and entry["problem"] == ""
    assert entry["input_schema"]["properties"]["title"]["type"] == "string"
    assert entry["hints"]["readOnlyHint"] is True
    assert read_calls(call_log) == []  # discovery calls no tool

    found = registry.get(TICKET)
    assert found is not None and found.source == "mcp"
    assert found.effect == Effect.NON_IDEMPOTENT_WRITE  # the read-only hint decides nothing
    assert found.needs_approval is False

    # The command discovers the same tools (a fresh child process).
    McpServer.objects.filter(pk=row.pk).update(tools_snapshot=[], last_synced_at=None)
    call_command("sync_mcp_tools", "--server", SERVER)
    row.refresh_from_db()
    assert row.last_synced_at is not None
    assert {e["registered_name"] for e in row.tools_snapshot} >= {
        TICKET,
        f"mcp__{SERVER}__echo",
        f"mcp__{SERVER}__fail",
    }


@pytest.mark.django_db(transaction=True)
@stdio_allowed
def test_a_stdio_remote_write_runs_on_the_first_pass_fenced_with_its_idempotency_key(
    tmp_path: Path,
) -> None:
    call_log = tmp_path / "calls.jsonl"
    row = stdio_server(call_log, requires_approval=False)
    mcp_server_sync(server=row)
    config = AgentConfigurationFactory(
        script=[
            {"tool_calls": [{"name": TICKET, "arguments": {"title": "printer on fire"}}]},
            {"content": "filed"},
        ]
    )

    result = runs.run_start_sync(configuration=config, prompt="file it")

    assert result.outcome == Outcome.COMPLETED, result.detail
    run = result.run
    assert run.status == Status.COMPLETED and run.output == "filed"
    assert run.pending_effect == "" and run.pending_call is None
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).count() == 0

    [event] = AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL)
    payload = event.payload
    assert payload["ok"] is True and payload["effect"] == Effect.NON_IDEMPOTENT_WRITE
    call_id = payload["call_id"]
    assert payload["idempotency_key"] == f"{run.uuid}:{call_id}"
    # The server echoed the request's _meta: the key and the fence reached it with the call.
    echoed = payload["result"]["structuredContent"]
    assert echoed["ticket"] == 1 and echoed["title"] == "printer on fire"
    assert echoed["meta"]["idempotency_key"] == f"{run.uuid}:{call_id}"
    assert echoed["meta"]["run_uuid"] == str(run.uuid)
    assert echoed["meta"]["call_id"] == call_id
    assert isinstance(echoed["meta"]["fencing_token"], int) and echoed["meta"]["fencing_token"] > 0
    assert echoed["meta"]["fencing_token"] <= run.lease_epoch
    # The next provider request carried that result to the model as the call's tool message.
    last_request = AgentRunEvent.objects.filter(run=run, kind=EventKind.REQUEST).last()
    sent = request_messages(last_request.run)[last_request.sequence]
    [tool_message] = [m for m in sent if m.get("role") == "tool"]
    assert tool_message["tool_call_id"] == call_id
    assert json.loads(tool_message["content"]) == payload["result"]
    assert f"{run.uuid}:{call_id}" in tool_message["content"]

    [call] = read_calls(call_log)  # exactly one call reached the process
    assert call["tool"] == "create_ticket" and call["arguments"] == {"title": "printer on fire"}
    assert call["meta"] == echoed["meta"]
