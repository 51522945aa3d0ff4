"""Remote calls against a real local stdio MCP server: outcomes that are not known (issue 11 §2),
the server's own words (its stderr), one session per segment, and the operator's read-only list
(docs/design.md §4.5).

The server is ``tests/support/mcp_stdio_server.py``; every call it receives is appended to a
call log with the server's pid, so a test sees how many processes served a segment.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import override_settings

from agentruns import transitions
from agentruns.leases import EventSpec
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
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.services.runtime.results import Outcome
from agentruns.tools import ToolContext, registry
from agentruns.tools.mcp_client import call_remote_tool
from agentruns.tools.mcp_sessions import session_scope
from agentruns.tools.mcp_tools import McpRefused
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import PROBE_NAMES, call, tool_turn
from tests.agentruns.support.transitions import claim_lease
from tests.support.mcp_stdio_server import read_calls, stdio_command

SERVER = "local"


@pytest.fixture(autouse=True)
def stdio_allowed() -> Any:
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MCP_STDIO_ALLOWED": True}):
        yield


def name(tool: str) -> str:
    return f"mcp__{SERVER}__{tool}"


def synced_server(call_log: Path, **fields: Any) -> McpServer:
    """A synced stdio server row (synced with a generous timeout, then given ``timeout_seconds``:
    a Python server takes a second or more to start on a busy machine)."""
    timeout = fields.pop("timeout_seconds", 30)
    row = McpServer.objects.create(
        name=SERVER,
        transport=McpTransport.STDIO,
        command=stdio_command(call_log),
        timeout_seconds=30,
        requires_approval=fields.pop("requires_approval", False),
        **fields,
    )
    result = mcp_server_sync(server=row)
    assert result.ok, result.error
    McpServer.objects.filter(pk=row.pk).update(timeout_seconds=timeout)
    row.refresh_from_db()
    return row


def start(*turns: dict[str, Any], tools: list[str] | None = None) -> Any:
    configuration = AgentConfigurationFactory(script=list(turns), tools=tools or [])
    return runs.run_start_sync(configuration=configuration, prompt="go")


def gone(pid: int, *, wait: float = 10) -> bool:
    """Whether the process has exited (a zombie counts): a bounded wait, not a timing."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        try:
            status = Path(f"/proc/{pid}/stat").read_text(errors="replace").split()
        except OSError:
            return True
        if len(status) > 2 and status[2] == "Z":
            return True
        time.sleep(0.05)
    return False


def take_over_once() -> Any:
    """A ``Probe.during`` hook: the first time, the lease moves to another worker (what a reaper
    and another worker do to a run whose holder looks dead)."""
    taken: list[bool] = []

    def during(entry: dict[str, Any]) -> None:
        if taken:
            return
        taken.append(True)
        run_id = AgentRun.objects.get().pk
        AgentRun.objects.filter(pk=run_id).update(lease_expires=Now() - timedelta(minutes=5))
        assert transitions.run_reclaim_stale(
            run_id=run_id,
            segment="reaper:test:1",
            event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
        )
        assert claim_lease(run_id=run_id, identity="worker:other:1") is not None

    return during


def tool_payloads(run: AgentRun) -> list[dict[str, Any]]:
    return [e.payload for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL)]


# --- Outcomes that are not known (issue 11 §2) ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_write_that_landed_and_then_stalled_waits_for_reconciliation(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    synced_server(log, timeout_seconds=5)
    result = start(
        tool_turn(
            call(name("echo"), text="opens the session"),  # so the timeout is the call's alone
            call(name("commit_and_stall"), message="fix the bug"),
        ),
        {"content": "done"},
    )

    assert result.outcome == Outcome.AWAITING_RECONCILIATION, result.detail
    run = result.run
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_call["name"] == name("commit_and_stall")
    [_, landed] = read_calls(log)  # the effect happened, once
    assert [p["name"] for p in tool_payloads(run)] == [name("echo")]  # no failure reported
    [doubt] = AgentRunEvent.objects.filter(run=run, kind=EventKind.IN_DOUBT)
    assert "no answer came within 5s" in doubt.payload["error"]
    assert "whether it took effect is unknown" in doubt.payload["error"]
    # The timed-out call was aborted: the stalled server does not outlive it.
    assert gone(landed["pid"])

    staff = UserFactory(permissions=["agentruns.decide_agentrun"])
    resumed = runs.run_reconcile(
        run_uuid=run.uuid,
        actor=staff,
        verdict="landed",
        turn_digest=card_digest(run),
        mode="inline",
    )
    assert resumed.outcome == Outcome.COMPLETED
    assert [c["tool"] for c in read_calls(log)] == ["echo", "commit_and_stall"]  # not resent


@pytest.mark.django_db(transaction=True)
def test_a_write_whose_server_dies_after_the_call_waits_with_its_last_words(
    tmp_path: Path,
) -> None:
    log = tmp_path / "calls.jsonl"
    synced_server(log)
    result = start(
        tool_turn(call(name("commit_and_vanish"), message="fix the bug")), {"content": "done"}
    )

    assert result.outcome == Outcome.AWAITING_RECONCILIATION, result.detail
    assert len(read_calls(log)) == 1
    [doubt] = AgentRunEvent.objects.filter(run=result.run, kind=EventKind.IN_DOUBT)
    error = doubt.payload["error"]
    assert "the call was sent and then" in error and "unknown" in error
    assert "fatal: lost my marbles after committing" in error
    assert "lost my marbles" in result.run.pending_turn["reason"]


@pytest.mark.django_db(transaction=True)
def test_an_error_answer_is_a_result_and_logs_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    synced_server(tmp_path / "calls.jsonl")
    result = start(tool_turn(call(name("fail"))), {"content": "ok"})

    assert result.outcome == Outcome.COMPLETED
    [payload] = tool_payloads(result.run)
    assert payload["ok"] is False and "read-only today" in payload["error"]
    records = [r for r in caplog.records if r.name.startswith("agentruns")]
    assert records and all(r.levelname == "WARNING" and r.exc_info is None for r in records)
    assert all("\n" not in r.getMessage() for r in records)


# --- The server's own words (issue 16 §1) -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_server_that_cannot_start_says_why_in_the_sync_the_call_and_the_admin(
    tmp_path: Path, client: Any
) -> None:
    reason = "fatal: repository '/srv/nope' does not exist"
    row = McpServer.objects.create(
        name=SERVER,
        transport=McpTransport.STDIO,
        command=stdio_command(refuse=reason),
        requires_approval=False,
    )
    result = mcp_server_sync(server=row)
    assert not result.ok
    assert reason in result.error and "nothing was sent" not in result.error
    row.refresh_from_db()
    assert reason in row.last_sync_error

    client.force_login(UserFactory(is_superuser=True))
    page = client.get(f"/admin/agentruns/mcpserver/{row.pk}/change/").content.decode()
    assert "/srv/nope" in page and "does not exist" in page

    # A call to a tool synced before the server broke: a definite failure, nothing was sent.
    McpServer.objects.filter(pk=row.pk).update(
        tools_snapshot=[
            {
                "name": "create_ticket",
                "registered_name": name("create_ticket"),
                "description": "Open a ticket.",
                "input_schema": {"type": "object", "properties": {}},
                "hints": {},
                "problem": "",
            }
        ]
    )
    run = start(tool_turn(call(name("create_ticket"))), {"content": "ok"}).run
    assert run.status == Status.COMPLETED
    [payload] = tool_payloads(run)
    assert payload["ok"] is False and payload["outcome"] == "executed"
    assert "nothing was sent" in payload["error"] and reason in payload["error"]


# --- One session per segment (issue 16 §3) ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_segment_keeps_one_server_process_for_its_calls(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    synced_server(log)
    turn = tool_turn(*(call(name("echo"), text=f"n{i}") for i in range(3)))

    first = start(turn, {"content": "ok"})
    second = start(turn, {"content": "ok"})

    assert first.outcome == second.outcome == Outcome.COMPLETED
    pids = [c["pid"] for c in read_calls(log)]
    assert len(pids) == 6
    assert len(set(pids[:3])) == 1 and len(set(pids[3:])) == 1  # one process per segment
    assert pids[0] != pids[3]
    assert gone(pids[0]) and gone(pids[3])  # closed with its segment


@pytest.mark.django_db(transaction=True)
def test_a_crashed_server_is_restarted_once_per_segment(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    # Listed read-only, so a lost connection is a failed read, not a write in doubt.
    synced_server(log, read_only_tools=["echo", "commit_and_vanish"])
    turn = tool_turn(
        call(name("echo"), text="a"),
        call(name("commit_and_vanish"), message="x"),
        call(name("echo"), text="b"),
        call(name("commit_and_vanish"), message="y"),
        call(name("echo"), text="c"),
    )
    result = start(turn, {"content": "ok"})

    assert result.outcome == Outcome.COMPLETED
    oks = [p["ok"] for p in tool_payloads(result.run)]
    assert oks == [True, False, True, False, False]
    served = read_calls(log)
    assert [c["tool"] for c in served] == ["echo", "commit_and_vanish"] * 2
    assert served[0]["pid"] == served[1]["pid"] != served[2]["pid"] == served[3]["pid"]
    last = tool_payloads(result.run)[-1]["error"]
    assert "ended twice in this segment" in last and "nothing was sent" in last


@pytest.mark.django_db(transaction=True)
def test_a_lost_lease_closes_the_segments_sessions_and_sends_nothing_more(
    tmp_path: Path, probes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    synced_server(log)
    probes.during = take_over_once()
    # Observe the moment the segment records what it noticed: its sessions are closed by then,
    # not only when the segment returns.
    seen: dict[str, bool] = {}
    notice = transitions.run_notice_cancel

    def observed(*args: Any, **kwargs: Any) -> Any:
        [echoed] = read_calls(log)
        seen["server_gone"] = gone(echoed["pid"], wait=2)
        return notice(*args, **kwargs)

    monkeypatch.setattr(transitions, "run_notice_cancel", observed)
    turn = tool_turn(
        call(name("echo"), text="before"),
        call("probe_read", value="the lease moves here"),
        call(name("create_ticket"), title="never"),
    )
    tools = [name("echo"), name("create_ticket"), *PROBE_NAMES]
    result = start(turn, {"content": "ok"}, tools=tools)

    assert result.outcome == Outcome.LEASE_LOST
    assert [c["tool"] for c in read_calls(log)] == ["echo"]  # the write never started
    assert seen == {"server_gone": True}


@pytest.mark.django_db
def test_a_closed_scope_opens_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    row = synced_server(log)
    context = ToolContext(
        run_uuid=uuid4(), call_id="c1", initiator_id=None, fencing_token=1, timeout_seconds=10
    )
    with session_scope() as scope:
        call_remote_tool(row, "echo", {"text": "one"}, context)
        call_remote_tool(row, "echo", {"text": "two"}, context)
        assert scope.opened == 1
        scope.close()
        with pytest.raises(McpRefused, match="nothing was sent"):
            call_remote_tool(row, "echo", {"text": "three"}, context)
    assert [c["arguments"]["text"] for c in read_calls(log)] == ["one", "two"]


# --- The operator's read-only list (issue 16 §6) ----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_tools_the_operator_lists_read_only_run_unapproved_and_unfenced(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    synced_server(log, requires_approval=True, read_only_tools=["echo"])
    echo, ticket = registry.get(name("echo")), registry.get(name("create_ticket"))
    assert echo.effect == Effect.READ and not echo.needs_approval
    # create_ticket declares readOnlyHint: the server's word decides nothing.
    assert ticket.hints["readOnlyHint"] is True
    assert ticket.effect == Effect.NON_IDEMPOTENT_WRITE and ticket.needs_approval

    result = start(tool_turn(call(name("echo"), text="hi")), {"content": "ok"})
    assert result.outcome == Outcome.COMPLETED
    [payload] = tool_payloads(result.run)
    assert payload["ok"] is True and payload["effect"] == Effect.READ

    waiting = start(tool_turn(call(name("create_ticket"), title="t")), {"content": "ok"})
    assert waiting.outcome == Outcome.AWAITING_APPROVAL
    assert [c["tool"] for c in read_calls(log)] == ["echo"]


@pytest.mark.django_db
def test_the_read_only_list_is_validated_and_edited_in_the_admin(
    tmp_path: Path, client: Any
) -> None:
    from django.core.exceptions import ValidationError

    row = McpServer(
        name=SERVER, transport=McpTransport.STDIO, command="x", read_only_tools="git_status"
    )
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert "read_only_tools" in refused.value.message_dict

    row = synced_server(tmp_path / "calls.jsonl", read_only_tools=["echo"])
    client.force_login(UserFactory(is_superuser=True))
    page = client.get(f"/admin/agentruns/mcpserver/{row.pk}/change/").content.decode()
    assert 'name="read_only_tools"' in page
    assert page.count("read-only (your list)") == 1  # echo's row of the tools table


# --- A killed process takes its servers with it -----------------------------------------------

HOLDER = """
import sys
import django
django.setup()
from uuid import uuid4
from agentruns.models import McpServer
from agentruns.tools import ToolContext
from agentruns.tools.mcp_client import call_remote_tool
from agentruns.tools.mcp_sessions import session_scope
row = McpServer(name="local", transport="stdio", command=sys.argv[1], timeout_seconds=600)
context = ToolContext(
    run_uuid=uuid4(), call_id="c1", initiator_id=None, fencing_token=1, timeout_seconds=600
)
with session_scope():
    call_remote_tool(row, "commit_and_stall", {"message": "held"}, context)
"""


def test_a_killed_segment_process_leaves_no_server_behind(tmp_path: Path) -> None:
    """SIGKILL the process that holds a session while its server is inside a call (a worker
    dying mid-call): the server, which would otherwise run its stalled call to the end, dies with
    it (``PR_SET_PDEATHSIG``)."""
    import os
    import signal
    import subprocess
    import sys

    log = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "AGENTRUNS_MCP_STDIO_ALLOWED": "true",
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, stdio_command(log)],
        cwd=Path(settings.BASE_DIR),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not read_calls(log):
            assert holder.poll() is None, "the holder exited before the call"
            assert time.monotonic() < deadline, "the call never reached the server"
            time.sleep(0.05)
        [held] = read_calls(log)
        assert not gone(held["pid"], wait=0.5)  # the server is there, inside the call
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert gone(held["pid"])
