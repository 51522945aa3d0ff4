"""Remote tools over MCP against a real local MCP server (docs/design.md §4.5, §5.1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings

from agentruns import transitions
from agentruns.exceptions import WriteWithoutDurableExecution
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    Effect,
    EventKind,
    McpServer,
    McpTransport,
    Status,
)
from agentruns.services import runs
from agentruns.services.mcp_sync import McpSyncResult, mcp_server_sync
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from agentruns.services.runtime.tool_step import execute_tool_call
from agentruns.services.runtime.transcript import tool_message_content
from agentruns.tools import registry
from agentruns.tools.mcp_client import call_remote_tool, new_session, session_key
from agentruns.tools.mcp_errors import McpCallFailed
from agentruns.tools.mcp_sessions import RemoteSession, session_scope
from agentruns.tools.mcp_tools import (
    build_snapshot,
    registered_name,
    server_name_of,
)
from agentruns.tools.registry import OutcomeUnknown, ToolContext
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.leases import reclaim_and_claim
from tests.support.http_recorder import HTTPRecorder
from tests.support.mcp_server import TicketServer, free_port, server_row, warm_sessions

TICKET = "mcp__tix__create_ticket"
ROOT = Path(settings.BASE_DIR)


def make_server(url: str, **fields: Any) -> McpServer:
    return McpServer.objects.create(name=fields.pop("name", "tix"), url=url, **fields)


def synced(server: TicketServer, **fields: Any) -> McpServer:
    """A synced row (synced with time to spare, then given ``timeout_seconds``)."""
    row: McpServer = server_row(server, **fields)
    return row


def ticket_script(title: str = "printer on fire") -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": TICKET, "arguments": {"title": title}}]},
        {"content": "filed"},
    ]


def tool_events(run: AgentRun) -> list[dict[str, Any]]:
    return [e.payload for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL)]


def in_thread(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = target()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


# --- The model: approval is read fail-closed ------------------------------------------------


@pytest.mark.django_db
def test_a_server_created_without_an_explicit_choice_requires_approval() -> None:
    row = McpServer.objects.create(name="plain", url="http://127.0.0.1:9/mcp")
    assert row.requires_approval is True and row.approval_required is True
    McpServer.objects.filter(pk=row.pk).update(requires_approval=None)
    row.refresh_from_db()
    assert row.requires_approval is None and row.approval_required is True
    McpServer.objects.filter(pk=row.pk).update(requires_approval=False)
    row.refresh_from_db()
    assert row.approval_required is False
    assert McpServer(name="unsaved").approval_required is True


@pytest.mark.django_db
def test_clean_refuses_stdio_unless_allowed_and_secrets_in_headers() -> None:
    stdio = McpServer(name="local", transport=McpTransport.STDIO, command="mcp-server --stdio")
    with pytest.raises(ValidationError) as refused:
        stdio.full_clean()
    assert "transport" in refused.value.message_dict
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MCP_STDIO_ALLOWED": True}):
        stdio.full_clean()
    with pytest.raises(ValidationError) as no_url:
        McpServer(name="nourl").full_clean()
    assert "url" in no_url.value.message_dict
    secret = McpServer(
        name="leaky", url="http://127.0.0.1:9/mcp", headers_env={"Authorization": "Bearer abc"}
    )
    with pytest.raises(ValidationError) as leaky:
        secret.full_clean()
    assert "headers_env" in leaky.value.message_dict
    for bad_name in ["a__b", "trailing_", "-dash", "has space"]:
        with pytest.raises(ValidationError):
            McpServer(name=bad_name, url="http://127.0.0.1:9/mcp").full_clean()


def test_registered_names_are_provider_safe_unique_and_parseable() -> None:
    assert registered_name("tix", "create_ticket") == TICKET
    odd = registered_name("tix", "tickets/create.v2 (beta)")
    assert odd.startswith("mcp__tix__tickets_create_v2__beta_-") and len(odd) <= 64
    long = registered_name("a-long-server-name-here", "x" * 200)
    assert len(long) == 64
    first = registered_name("tix", "a.b")
    second = registered_name("tix", "a_b", taken={first, "mcp__tix__a_b"})
    assert first != second and len({first, second}) == 2
    for name in (odd, long, first, second):
        assert all(c.isalnum() or c in "_-" for c in name)
    assert server_name_of(long) == "a-long-server-name-here"
    assert server_name_of("create_note") is None


# --- Discovery -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_sync_stores_tools_and_registers_them_as_writes_whatever_the_hints(
    mcp_server: TicketServer,
) -> None:
    row = make_server(mcp_server.url, requires_approval=False, allowed_tools=[])
    call_command("sync_mcp_tools", "--server", "tix")
    row.refresh_from_db()
    assert row.last_synced_at is not None and row.last_sync_error == ""
    by_name = {e["name"]: e for e in row.tools_snapshot}
    assert set(by_name) == {"create_ticket", "echo", "fail"}
    entry = by_name["create_ticket"]
    assert entry["registered_name"] == TICKET
    assert entry["input_schema"]["properties"]["title"]["type"] == "string"
    assert entry["hints"]["readOnlyHint"] is True
    assert mcp_server.calls == []  # discovery calls no tool

    found = registry.get(TICKET)
    assert found is not None
    # The server claims read-only and idempotent; the effect is still a non-idempotent write.
    assert found.effect == Effect.NON_IDEMPOTENT_WRITE
    assert found.source == "mcp"
    assert found.hints["readOnlyHint"] is True
    assert found.requires_approval is False and found.needs_approval is False
    assert found.parameters == entry["input_schema"]
    assert {"mcp__tix__create_ticket", "mcp__tix__echo"} <= {t.name for t in registry.all()}

    # The allow-list and the enabled switch count at once, without a new sync.
    McpServer.objects.filter(pk=row.pk).update(allowed_tools=["echo"])
    assert registry.get(TICKET) is None and registry.get("mcp__tix__echo") is not None
    assert registry.effect_of(TICKET) == Effect.NON_IDEMPOTENT_WRITE  # unknown: fail closed
    McpServer.objects.filter(pk=row.pk).update(enabled=False, allowed_tools=[])
    assert registry.get("mcp__tix__echo") is None


@pytest.mark.django_db
def test_approval_follows_the_server_row_fail_closed(mcp_server: TicketServer) -> None:
    row = synced(mcp_server)  # no explicit choice
    assert registry.get(TICKET).needs_approval is True
    McpServer.objects.filter(pk=row.pk).update(requires_approval=None)
    assert registry.get(TICKET).needs_approval is True
    McpServer.objects.filter(pk=row.pk).update(requires_approval=False)
    assert registry.get(TICKET).needs_approval is False


@pytest.mark.django_db
def test_sync_of_an_unreachable_server_records_the_error() -> None:
    row = make_server(f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(CommandError):
        call_command("sync_mcp_tools")
    row.refresh_from_db()
    assert row.last_synced_at is None and "listing tools failed" in row.last_sync_error
    result = mcp_server_sync(server=row)  # a failure is recorded and returned, not raised
    assert not result.ok and result.snapshot == []
    assert "listing tools failed" in result.error and row.last_sync_error == result.error


@pytest.mark.django_db
def test_a_tool_whose_schema_refers_outside_it_is_skipped_by_the_sync_and_never_fetched(
    mcp_server: TicketServer, http_recorder: HTTPRecorder, client: Any
) -> None:
    remote = http_recorder.url("/x.json")
    mcp_server.offer("lookup", {"type": "object", "properties": {"q": {"$ref": remote}}})
    make_server(mcp_server.url)
    out = StringIO()
    call_command("sync_mcp_tools", "--server", "tix", stdout=out)
    row = McpServer.objects.get(name="tix")
    by_name = {e["name"]: e for e in row.tools_snapshot}
    problem = by_name["lookup"]["problem"]
    assert remote in problem and "only references inside the schema" in problem
    assert f"skipped 'lookup': {problem}" in out.getvalue()
    assert row.last_sync_error == ""  # the other tools synced
    assert registry.get("mcp__tix__lookup") is None
    assert registry.get(TICKET) is not None

    # The admin's "Sync tools" says so too.
    client.force_login(UserFactory(is_superuser=True))
    response = client.post(
        "/admin/agentruns/mcpserver/",
        {"action": "sync_tools", "_selected_action": [row.pk]},
        follow=True,
    )
    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("tix: 4 tools (skipped 'lookup': ") and remote in message

    # A snapshot stored before the rule (no problem recorded) is refused at lookup too.
    by_name["lookup"]["problem"] = ""
    McpServer.objects.filter(pk=row.pk).update(tools_snapshot=list(by_name.values()))
    assert registry.get("mcp__tix__lookup") is None
    assert "mcp__tix__lookup" not in {t.name for t in registry.all()}
    assert http_recorder.requests == []


def test_a_tool_whose_schema_the_registry_refuses_is_kept_but_not_registered() -> None:
    class Remote:
        name = "weird"
        title = None
        description = "d"
        input_schema = {"type": "array"}
        annotations = None

    [entry] = build_snapshot("tix", [Remote()])
    assert entry["problem"] and entry["registered_name"] == "mcp__tix__weird"


def test_a_sync_result_names_the_usable_tools_and_the_skipped_ones() -> None:
    class Weird:
        name = "weird"
        title = None
        description = "d"
        input_schema = {"type": "array"}
        annotations = None

    class Fine(Weird):
        name = "fine"
        input_schema = {"type": "object", "properties": {}}

    result = McpSyncResult(server_name="tix", snapshot=build_snapshot("tix", [Fine(), Weird()]))
    assert result.ok and result.usable == ["mcp__tix__fine"]
    [(name, problem)] = result.skipped
    assert name == "weird" and problem


@pytest.mark.django_db
def test_a_refused_sync_is_recorded_and_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    row = McpServer.objects.create(
        name="local", transport=McpTransport.STDIO, command=f"touch {marker}"
    )
    result = mcp_server_sync(server=row)  # stdio is off (AGENTRUNS["MCP_STDIO_ALLOWED"])
    assert not result.ok and "stdio" in result.error
    row.refresh_from_db()
    assert row.last_sync_error == result.error and row.last_synced_at is None
    assert not marker.exists()


# --- Approval and the first pass -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_remote_write_suspends_when_its_server_requires_approval(
    mcp_server: TicketServer,
) -> None:
    synced(mcp_server)
    config = AgentConfigurationFactory(script=ticket_script())
    result = runs.run_start_sync(configuration=config, prompt="file it")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert mcp_server.calls == []
    [shown] = result.run.pending_turn["calls"]
    assert shown["name"] == TICKET and shown["source"] == "mcp"
    assert shown["effect"] == Effect.NON_IDEMPOTENT_WRITE
    assert shown["hints"]["readOnlyHint"] is True  # shown, not obeyed

    staff = UserFactory(permissions=["agentruns.decide_agentrun"])
    decided = runs.run_decide(
        run_uuid=result.run.uuid,
        actor=staff,
        approved=True,
        turn_digest=result.run.pending_turn["turn_digest"],
        mode="inline",
    )
    assert decided.outcome == Outcome.COMPLETED
    assert [c.tool for c in mcp_server.calls] == ["create_ticket"]


@pytest.mark.django_db(transaction=True)
def test_with_approval_off_a_remote_write_runs_on_the_first_pass_fenced(
    mcp_server: TicketServer,
) -> None:
    synced(mcp_server, requires_approval=False)
    config = AgentConfigurationFactory(script=ticket_script())
    mcp_server.hold()
    thread, box = in_thread(lambda: runs.run_start_sync(configuration=config, prompt="file it"))
    try:
        [call] = mcp_server.wait_for_calls(1)
        # The server holds the call: the fence is on the row, under the segment's lease.
        run = AgentRun.objects.get()
        assert run.status == Status.RUNNING
        assert run.claimed_by.startswith("interactive:")
        assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
        assert run.pending_call["name"] == TICKET
        assert run.pending_call["arguments"] == {"title": "printer on fire"}
        assert call.meta["idempotency_key"] == f"{run.uuid}:{run.pending_call['id']}"
        assert call.meta["fencing_token"] == run.lease_epoch
    finally:
        mcp_server.release()
        thread.join(timeout=30)
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.outcome == Outcome.COMPLETED
    assert result.run.pending_effect == "" and result.run.output == "filed"
    assert AgentRunEvent.objects.filter(run=result.run, kind=EventKind.APPROVAL).count() == 0
    [event] = tool_events(result.run)
    assert event["ok"] is True and event["effect"] == Effect.NON_IDEMPOTENT_WRITE
    assert event["result"]["structuredContent"] == {"ticket": 1}
    assert len(mcp_server.tool_calls("create_ticket")) == 1


READ_THEN_WRITE = [
    {
        "tool_calls": [
            {"name": "mcp__tix__echo", "arguments": {"text": "status?"}},
            {"name": TICKET, "arguments": {"title": "printer on fire"}},
        ]
    },
    {"content": "filed"},
]


def approval_switched_on_during_the_read(mcp_server: TicketServer) -> dict[str, Any]:
    """Start a run whose turn is a read and then a write of a server that requires no
    approval; while the server holds the read, switch the server's approval on, then let the
    read finish. Returns what the segment came to (``result`` or ``error``)."""
    row = synced(mcp_server, requires_approval=False, read_only_tools=["echo"])
    config = AgentConfigurationFactory(script=READ_THEN_WRITE)
    mcp_server.hold()
    thread, box = in_thread(lambda: runs.run_start_sync(configuration=config, prompt="file it"))
    try:
        [read] = mcp_server.wait_for_calls(1)  # the read is running: the server holds it
        assert read.tool == "echo"
        McpServer.objects.filter(pk=row.pk).update(requires_approval=True)
    finally:
        mcp_server.release()
        thread.join(timeout=30)
    return box


def assert_the_write_waits(run: AgentRun, mcp_server: TicketServer) -> None:
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL and run.pending_effect == ""
    [shown] = run.pending_turn["calls"]  # the read is done: only the write waits
    assert (shown["name"], shown["needs_approval"]) == (TICKET, True)
    [echoed] = tool_events(run)
    assert (echoed["name"], echoed["outcome"]) == ("mcp__tix__echo", "executed")
    assert [c.tool for c in mcp_server.calls] == ["echo"]


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_server_requires_approval_from_mid_turn_waits_for_it(
    mcp_server: TicketServer,
) -> None:
    """A turn of a read and then a write of one server, which requires no approval when the
    turn starts: nothing waits, the read runs. While the read runs, the operator switches the
    server's approval on. The write is judged on the row as it is when it comes to run: it
    waits for a decision, its body never runs until someone approves it."""
    box = approval_switched_on_during_the_read(mcp_server)
    assert "error" not in box, box.get("error")
    result = box["result"]

    assert mcp_server.tool_calls("create_ticket") == [], "the write ran without an approval"
    assert result.outcome == Outcome.AWAITING_APPROVAL, result
    run = AgentRun.objects.get(pk=result.run.pk)
    assert_the_write_waits(run, mcp_server)

    staff = UserFactory(permissions=["agentruns.decide_agentrun"])
    decided = runs.run_decide(
        run_uuid=run.uuid,
        actor=staff,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )
    assert decided.outcome == Outcome.COMPLETED, decided
    assert [c.tool for c in mcp_server.calls] == ["echo", "create_ticket"]  # each once


@pytest.mark.django_db(transaction=True)
def test_a_segment_dying_before_that_wait_is_written_leaves_the_next_one_to_write_it(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same turn, and the segment dies after the read's boundary, before its suspend: the
    segment that continues the run runs the read no more, and the write waits for approval."""

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise ProcessDied()

    monkeypatch.setattr(transitions, "run_suspend", dies)
    box = approval_switched_on_during_the_read(mcp_server)
    assert isinstance(box.get("error"), ProcessDied), box
    monkeypatch.undo()
    run = AgentRun.objects.get()
    assert run.status == Status.RUNNING  # the reaper's once its lease runs out

    result = continue_segment(reclaim_and_claim(run))

    assert result.outcome == Outcome.AWAITING_APPROVAL, result
    assert_the_write_waits(run, mcp_server)


@pytest.mark.django_db
def test_an_unleased_call_is_refused_before_any_request_reaches_the_server(
    mcp_server: TicketServer,
) -> None:
    synced(mcp_server, requires_approval=False)
    before = mcp_server.http_requests
    with pytest.raises(WriteWithoutDurableExecution):
        execute_tool_call(
            tool=registry.get(TICKET),
            name=TICKET,
            call_id="call_0",
            arguments={"title": "x"},
            lease=None,
            initiator_id=None,
            run_uuid=uuid4(),
        )
    assert mcp_server.http_requests == before
    assert mcp_server.calls == []


# --- Errors the model sees --------------------------------------------------------------------


def _error_run(config_script: list[dict[str, Any]]) -> AgentRun:
    config = AgentConfigurationFactory(script=config_script)
    result = runs.run_start_sync(configuration=config, prompt="try")
    assert result.outcome == Outcome.COMPLETED, result.detail
    assert result.run.status == Status.COMPLETED and result.run.pending_effect == ""
    return result.run


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_server_gives_the_model_an_error_result() -> None:
    row = make_server(f"http://127.0.0.1:{free_port()}/mcp", requires_approval=False)
    McpServer.objects.filter(pk=row.pk).update(
        tools_snapshot=[
            {
                "name": "create_ticket",
                "registered_name": TICKET,
                "description": "Open a ticket.",
                "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}},
                "hints": {},
                "problem": "",
            }
        ]
    )
    run = _error_run(ticket_script())
    [event] = tool_events(run)
    assert event["ok"] is False and "tix" in event["error"] and "ConnectError" in event["error"]
    assert "ConnectError" in json.loads(tool_message_content(event))["error"]  # what the model saw


@pytest.mark.django_db(transaction=True)
def test_an_is_error_answer_is_a_result(mcp_server: TicketServer) -> None:
    synced(mcp_server, requires_approval=False, timeout_seconds=1)
    run = _error_run(
        [{"tool_calls": [{"name": "mcp__tix__fail", "arguments": {}}]}, {"content": "ok"}]
    )
    [event] = tool_events(run)
    assert event["ok"] is False and "read-only today" in event["error"]


@pytest.mark.django_db(transaction=True)
def test_a_write_sent_then_timed_out_waits_for_reconciliation(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11 §2: the server received the call (it landed) and then held it past the timeout:
    the outcome is unknown, so the run parks in doubt instead of telling the model it failed.

    The session is open before the segment starts, so the 1s is the call's alone (a session's
    start on a busy machine can take longer: the call would then, rightly, not be sent)."""
    row = synced(mcp_server, requires_approval=False, timeout_seconds=1)
    scopes = warm_sessions(monkeypatch, row)
    config = AgentConfigurationFactory(script=ticket_script())
    mcp_server.hold()
    try:
        result = runs.run_start_sync(configuration=config, prompt="try")
    finally:
        mcp_server.release()
    assert [scope.opened for scope in scopes] == [1]  # the call used the open session
    assert result.outcome == Outcome.AWAITING_RECONCILIATION, result.detail
    run = result.run
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE and run.pending_call["name"] == TICKET
    assert len(mcp_server.tool_calls("create_ticket")) == 1  # it reached the server
    assert tool_events(run) == []  # never reported to the model as a failure
    [doubt] = AgentRunEvent.objects.filter(run=run, kind=EventKind.IN_DOUBT)
    assert "no answer came within 1s" in doubt.payload["error"]
    assert "whether it took effect is unknown" in doubt.payload["error"]
    assert "no answer came within 1s" in run.pending_turn["reason"]


def call_context() -> ToolContext:
    return ToolContext(
        run_uuid=uuid4(), call_id="c1", initiator_id=None, fencing_token=1, timeout_seconds=30
    )


@pytest.mark.django_db(transaction=True)
def test_a_timeout_the_sdks_own_clock_notices_first_is_the_same_verdict(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is watched by the caller and, as a backstop, by the SDK's request timer. A
    caller's thread that wakes late (a busy machine) lets the SDK's timer answer first: that is
    still "no answer came within 1s", not a different story about the same timeout."""
    row = synced(mcp_server, requires_approval=False, timeout_seconds=1)
    real_request = RemoteSession.request

    def late_caller(self: RemoteSession, make: Any, deadline: float) -> Any:
        return real_request(self, make, deadline + 5)

    monkeypatch.setattr(RemoteSession, "request", late_caller)
    mcp_server.hold()
    try:
        with session_scope() as scope:
            scope.session(
                session_key(row, 1.0), lambda: new_session(row, 1.0), time.monotonic() + 30
            )
            with pytest.raises(OutcomeUnknown) as unknown:
                call_remote_tool(row, "create_ticket", {"title": "t"}, call_context())
    finally:
        mcp_server.release()
    assert "the call was sent and no answer came within 1s" in str(unknown.value)
    assert len(mcp_server.tool_calls("create_ticket")) == 1


@pytest.mark.django_db(transaction=True)
def test_a_call_whose_time_ran_out_before_it_was_handed_over_was_not_sent(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline can pass between opening the session and handing the call to it (a slow
    start on a busy machine). Nothing was sent then: a definite failure, not a doubt that would
    park the run for a person to reconcile a call the server never saw."""
    row = synced(mcp_server, requires_approval=False, timeout_seconds=1)
    real_request = RemoteSession.request
    busy = threading.Event()

    def busy_loop(self: RemoteSession, make: Any, deadline: float) -> Any:
        # The session's loop cannot run the call until the caller has stopped waiting.
        assert self._loop is not None
        self._loop.call_soon_threadsafe(busy.wait, 30)
        try:
            return real_request(self, make, deadline)
        finally:
            busy.set()

    monkeypatch.setattr(RemoteSession, "request", busy_loop)
    with session_scope() as scope:
        scope.session(session_key(row, 1.0), lambda: new_session(row, 1.0), time.monotonic() + 30)
        with pytest.raises(McpCallFailed) as failed:
            call_remote_tool(row, "create_ticket", {"title": "t"}, call_context())
    assert "ran out before the call was sent; nothing was sent" in str(failed.value)
    assert mcp_server.tool_calls("create_ticket") == []


@pytest.mark.django_db(transaction=True)
def test_stdio_is_refused_at_call_time_without_starting_anything(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    row = McpServer.objects.create(
        name="tix",
        transport=McpTransport.STDIO,
        command=f"{sys.executable} -c \"open('{marker}', 'w')\"",
        requires_approval=False,
    )
    McpServer.objects.filter(pk=row.pk).update(
        tools_snapshot=[
            {
                "name": "create_ticket",
                "registered_name": TICKET,
                "description": "Open a ticket.",
                "input_schema": {"type": "object", "properties": {}},
                "hints": {},
                "problem": "",
            }
        ]
    )
    run = _error_run(ticket_script())
    [event] = tool_events(run)
    assert event["ok"] is False and "MCP_STDIO_ALLOWED" in event["error"]
    assert not marker.exists()


@pytest.mark.django_db(transaction=True)
def test_a_missing_header_secret_refuses_the_call_unsent(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASEHOLD_TIX_TOKEN", "s3cret")
    row = synced(
        mcp_server, requires_approval=False, headers_env={"X-Token": "LEASEHOLD_TIX_TOKEN"}
    )
    monkeypatch.delenv("LEASEHOLD_TIX_TOKEN")
    before = mcp_server.http_requests
    run = _error_run(ticket_script())
    [event] = tool_events(run)
    assert event["ok"] is False and "LEASEHOLD_TIX_TOKEN" in event["error"]
    assert "s3cret" not in str(row.__dict__)
    assert mcp_server.http_requests == before


@pytest.mark.django_db(transaction=True)
def test_a_header_variable_outside_the_allowlist_sends_nothing(
    mcp_server: TicketServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-process-secret")
    row = synced(mcp_server, requires_approval=False)
    # Written around model validation, as a row edited some other way would be.
    McpServer.objects.filter(pk=row.pk).update(headers_env={"X-Token": "DJANGO_SECRET_KEY"})
    row.refresh_from_db()
    before = mcp_server.http_requests

    result = mcp_server_sync(server=row)
    assert not result.ok
    assert result.error.startswith(
        "MCP server 'tix', header 'X-Token': DJANGO_SECRET_KEY may not hold a secret"
    )
    assert isinstance(result.error, str) and "the-process-secret" not in result.error
    row.refresh_from_db()
    assert row.last_sync_error == result.error

    run = _error_run(ticket_script())
    [event] = tool_events(run)
    assert event["ok"] is False and "DJANGO_SECRET_KEY may not hold a secret" in event["error"]
    assert "the-process-secret" not in event["error"]
    assert mcp_server.http_requests == before  # neither the sync nor the call sent anything
    assert mcp_server.calls == []


# --- A worker SIGKILLed while the server holds the call ---------------------------------------

WORKER = """
import sys
import django
django.setup()
from agentruns.services import runs
runs.run_process_queued(run_uuid=sys.argv[1])
"""


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_call_leaves_the_run_for_reconciliation(
    mcp_server: TicketServer,
) -> None:
    synced(mcp_server, requires_approval=False)
    config = AgentConfigurationFactory(script=ticket_script())
    run = transitions.run_enqueue(
        configuration=config, initiator_id=None, prompt="file it", request={"prompt": "file it"}
    )
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "AGENTRUNS_LEASE_SECONDS": "3",
    }
    env.pop("TEST_DB_NAME", None)
    mcp_server.hold()
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(run.uuid)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        mcp_server.wait_for_calls(1, timeout=60)
        run.refresh_from_db()
        assert run.status == Status.RUNNING and run.claimed_by.startswith("worker:")
        assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
        assert run.pending_call["name"] == TICKET
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    deadline = time.monotonic() + 30
    while not AgentRun.objects.filter(pk=run.pk, lease_expires__lt=Now()).exists():
        assert time.monotonic() < deadline, "the dead worker's lease never expired"
        time.sleep(0.2)
    call_command("reap_stale_runs", stdout=StringIO())
    mcp_server.release()
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert run.pending_call["name"] == TICKET
    assert len(mcp_server.tool_calls("create_ticket")) == 1
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).count() == 1


@pytest.mark.django_db
def test_the_admin_syncs_tools_and_shows_hints_as_information(
    mcp_server: TicketServer, client: Any
) -> None:
    row = make_server(mcp_server.url)
    admin_user = UserFactory(is_superuser=True)
    client.force_login(admin_user)
    response = client.post(
        "/admin/agentruns/mcpserver/",
        {"action": "sync_tools", "_selected_action": [row.pk]},
        follow=True,
    )
    assert response.status_code == 200
    row.refresh_from_db()
    assert {e["registered_name"] for e in row.tools_snapshot} >= {TICKET}
    page = client.get(f"/admin/agentruns/mcpserver/{row.pk}/change/").content.decode()
    assert TICKET in page and "readOnlyHint=True" in page and "decide nothing" in page
