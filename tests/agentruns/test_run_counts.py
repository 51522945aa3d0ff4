"""Rounds and tokens count what happened, for every status (``agentruns.run_counts``): a run
that waits, is cancelled or completes shows the rounds its trace shows, the same in the
playground, the API and the admin."""

from __future__ import annotations

import pytest

from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.run_counts import run_counts
from agentruns.services import runs
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import digest, waiting_for_approval

pytestmark = pytest.mark.django_db

USAGE = {"prompt_tokens": 11, "completion_tokens": 4}
SCRIPT = [
    {"tool_calls": [{"name": "list_notes", "arguments": {}}], "usage": USAGE},
    {
        "tool_calls": [{"name": "create_note", "arguments": {"title": "t", "body": "b"}}],
        "usage": USAGE,
    },
    {"content": "done", "usage": USAGE},
]


def _rounds_in_trace(run: AgentRun) -> int:
    return AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).count()


def test_a_waiting_run_counts_its_rounds_and_tokens_so_far() -> None:
    run = waiting_for_approval(script=SCRIPT)
    counts = run_counts(run)
    assert _rounds_in_trace(run) == 2
    assert (counts.rounds, counts.prompt_tokens, counts.completion_tokens) == (2, 22, 8)
    assert counts.total_tokens == 30
    assert run.iterations == 0  # the columns are written when a run settles


def test_a_cancelled_run_counts_what_happened_before_the_cancel() -> None:
    run = waiting_for_approval(script=SCRIPT)
    assert runs.run_cancel(run_uuid=run.uuid, note="test")
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    counts = run_counts(run)
    assert (counts.rounds, counts.total_tokens) == (_rounds_in_trace(run), 30)


def test_a_completed_run_counts_what_its_columns_say() -> None:
    user = UserFactory(is_superuser=True)
    run = waiting_for_approval(user, script=SCRIPT)
    runs.run_decide(
        run_uuid=run.uuid, actor=user, approved=True, turn_digest=digest(run), mode="inline"
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    counts = run_counts(run)
    assert (counts.rounds, counts.total_tokens) == (3, 45)
    assert (run.iterations, run.total_tokens) == (3, 45)


def test_an_unreadable_loop_state_falls_back_to_the_columns() -> None:
    run = waiting_for_approval(script=SCRIPT)
    AgentRun.objects.filter(pk=run.pk).update(loop_state="broken", iterations=7)
    run.refresh_from_db()
    assert run_counts(run).rounds == 7


def test_every_surface_counts_a_cancelled_run_the_same(client) -> None:
    boss = UserFactory(is_superuser=True)
    run = waiting_for_approval(boss, script=SCRIPT)
    assert runs.run_cancel(run_uuid=run.uuid, note="test")
    client.force_login(boss)
    body = client.get(f"/api/runs/{run.uuid}/").json()
    assert (body["iterations"], body["prompt_tokens"], body["completion_tokens"]) == (2, 22, 8)
    assert body["total_tokens"] == 30
    listed = client.get("/api/runs/").json()["results"][0]
    assert (listed["iterations"], listed["total_tokens"]) == (2, 30)
    page = client.get(f"/playground/runs/{run.uuid}/").content.decode()
    assert "2 rounds · 22 + 8 = 30 tokens" in page
    timeline = client.get(f"/admin/approvals/runs/{run.uuid}/").content.decode()
    assert "2 rounds · 22 + 8 = 30 tokens" in timeline
