"""The ledger tests' helpers: an approved run, its event stream, ``verify_ledger``, the audit export
and the README's verification script."""

from __future__ import annotations

import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import runs
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

ROOT = Path(__file__).resolve().parents[3]


NOTE = {"name": "create_note", "arguments": {"title": "t", "body": "b"}}


DECIDER = ["agentruns.decide_agentrun"]


def approved_run(*, floats: bool = False) -> AgentRun:
    """A run through real transitions: born, paused for approval, approved inline by a person
    (an event with an actor), completed. ``floats``: its answer carries awkward numbers."""
    answer = {"content": "done"}
    script = [{"tool_calls": [NOTE]}, answer]
    if floats:
        # Refused at once (no such arguments): its event stores the numbers as the model sent
        # them, whole floats too (PostgreSQL's jsonb gives 1e16 back as an integer).
        odd = {"title": "t", "body": "b", "weight": 1e16, "ratio": 0.1, "whole": 2.0}
        script = [{"tool_calls": [{**NOTE, "arguments": odd}]}, {"tool_calls": [NOTE]}, answer]
    configuration = AgentConfigurationFactory(tools=[], script=script)
    started = runs.run_start_sync(configuration=configuration, prompt="go")
    staff = UserFactory(permissions=DECIDER)
    runs.run_decide(
        run_uuid=started.run.uuid,
        actor=staff,
        approved=True,
        turn_digest=started.run.pending_turn["turn_digest"],
        mode="inline",
    )
    run = AgentRun.objects.get(pk=started.run.pk)
    assert run.status == Status.COMPLETED
    return run


def stream(run: AgentRun) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run=run).order_by("sequence"))


PLAIN_MODE = "mode: plain SHA-256 (no AGENTRUNS_LEDGER_KEY: a keyed event cannot be checked)\n"


def verify(*args: str, mode: str = PLAIN_MODE) -> tuple[int, str]:
    """The command's exit status and what it printed after its first line, which names the
    mode it checked in (``mode``); bad arguments (2) are refused before anything is checked."""
    out = StringIO()
    try:
        call_command("verify_ledger", *args, stdout=out)
    except CommandError as exc:
        printed, code = out.getvalue() + str(exc), exc.returncode
    else:
        printed, code = out.getvalue(), 0
    if code == 2:
        return code, printed
    assert printed.startswith(mode), printed
    return code, printed[len(mode) :]


def sql(statement: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def api_for(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def export(run: AgentRun, tmp_path: Path) -> Path:
    staff = UserFactory(is_staff=True, permissions=DECIDER)
    response = api_for(staff).get(f"/api/runs/{run.uuid}/audit/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jsonl"
    assert f"run-{run.uuid}-audit.jsonl" in response["Content-Disposition"]
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(response.streaming_content))
    return path


def readme_script(tmp_path: Path) -> Path:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- verify-audit-script -->\s*```python\n(.*?)```", readme, re.S)
    assert block is not None, "the README shows the verification script"
    script = tmp_path / "verify_audit.py"
    script.write_text(block.group(1))
    return script


def run_script(script: Path, exported: Path) -> subprocess.CompletedProcess:
    # -I: isolated, nothing of Leasehold (or this checkout) importable.
    return subprocess.run(
        [sys.executable, "-I", str(script), str(exported)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=exported.parent,
    )
