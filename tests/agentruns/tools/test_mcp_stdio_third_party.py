"""Remote tools against MCP servers nobody here wrote (issue 16 §7): ``mcp-server-time`` and
``mcp-server-git`` from PyPI (the ``dev`` extra), started over stdio with the running interpreter,
synced and called in runs beside the project's own test servers."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns.models import AgentRunEvent, Effect, EventKind, McpServer, McpTransport, Status
from agentruns.services import runs
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.services.runtime.results import Outcome
from agentruns.tools import registry
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory


@pytest.fixture(autouse=True)
def stdio_allowed() -> Any:
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MCP_STDIO_ALLOWED": True}):
        yield


def command(module: str, *args: str) -> str:
    return shlex.join([sys.executable, "-m", module, *args])


def server(name: str, cmd: str, **fields: Any) -> McpServer:
    return McpServer.objects.create(
        name=name, transport=McpTransport.STDIO, command=cmd, timeout_seconds=30, **fields
    )


def tool_payloads(run: Any) -> list[dict[str, Any]]:
    return [e.payload for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.TOOL)]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.django_db(transaction=True)
def test_mcp_server_time_syncs_over_stdio_and_answers_in_a_run() -> None:
    row = server("time", command("mcp_server_time", "--local-timezone", "UTC"))
    result = mcp_server_sync(server=row)
    assert result.ok, result.error
    assert set(result.usable) == {"mcp__time__get_current_time", "mcp__time__convert_time"}
    hinted = registry.get("mcp__time__get_current_time")
    assert hinted.hints["readOnlyHint"] is True
    assert hinted.effect == Effect.NON_IDEMPOTENT_WRITE and hinted.needs_approval

    # The operator lists it read-only: it runs without approval and unfenced.
    McpServer.objects.filter(pk=row.pk).update(read_only_tools=["get_current_time"])
    configuration = AgentConfigurationFactory(
        script=[
            {
                "tool_calls": [
                    {"name": "mcp__time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}
                ]
            },
            {"content": "it is late in Tokyo"},
        ]
    )
    run = runs.run_start_sync(configuration=configuration, prompt="what time is it?").run
    assert run.status == Status.COMPLETED
    [payload] = tool_payloads(run)
    assert payload["ok"] is True and payload["effect"] == Effect.READ
    assert payload["result"]["structuredContent"]["timezone"] == "Asia/Tokyo"


@pytest.mark.django_db(transaction=True)
def test_mcp_server_git_commits_once_after_approval_and_reads_unattended(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.name", "Leasehold Test")
    git(repo, "config", "user.email", "test@example.invalid")
    (repo / "notes.txt").write_text("first note\n")
    row = server(
        "git",
        command("mcp_server_git", "--repository", str(repo)),
        read_only_tools=["git_status", "git_log"],
    )
    assert mcp_server_sync(server=row).ok
    commit = {"repo_path": str(repo), "message": "Add notes"}
    configuration = AgentConfigurationFactory(
        script=[
            {
                "tool_calls": [
                    {"name": "mcp__git__git_status", "arguments": {"repo_path": str(repo)}}
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "mcp__git__git_add",
                        "arguments": {"repo_path": str(repo), "files": ["notes.txt"]},
                    },
                    {"name": "mcp__git__git_commit", "arguments": commit},
                ]
            },
            {"content": "committed"},
        ]
    )
    waiting = runs.run_start_sync(configuration=configuration, prompt="commit the notes")

    assert waiting.outcome == Outcome.AWAITING_APPROVAL  # the read ran, the writes wait
    [status] = tool_payloads(waiting.run)
    assert status["ok"] is True and "notes.txt" in str(status["result"])
    shown = waiting.run.pending_turn["calls"]
    assert [c["name"] for c in shown] == ["mcp__git__git_add", "mcp__git__git_commit"]
    assert git(repo, "rev-list", "--all", "--count").strip() == "0"

    staff = UserFactory(permissions=["agentruns.decide_agentrun"])
    done = runs.run_decide(
        run_uuid=waiting.run.uuid,
        actor=staff,
        approved=True,
        turn_digest=waiting.run.pending_turn["turn_digest"],
        mode="inline",
    )
    assert done.outcome == Outcome.COMPLETED
    assert git(repo, "log", "--format=%s").splitlines() == ["Add notes"]  # exactly once
    assert [p["ok"] for p in tool_payloads(done.run)] == [True, True, True]


@pytest.mark.django_db
def test_mcp_server_git_on_a_missing_repository_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    row = server("git", command("mcp_server_git", "--repository", str(missing)))
    result = mcp_server_sync(server=row)
    assert not result.ok
    assert f"{missing} does not exist" in result.error
    row.refresh_from_db()
    assert f"{missing} does not exist" in row.last_sync_error
