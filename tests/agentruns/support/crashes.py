"""Crash helpers: an in-process crash point (``ProcessDied``) and what the real-process crash
tests share (a queued run, its row and events, an approval, one reaper verdict)."""

from __future__ import annotations

from django.db.models.functions import Now

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import reaper, runs
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.support.processes import (
    wait_until,
)


class ProcessDied(BaseException):
    """Stands for the process vanishing mid-step: nothing in the runtime catches it."""


DECIDE = "agentruns.decide_agentrun"


# Approving call_webhook also needs its approve_permission (docs/design.md §5.6).
APPROVER = [DECIDE, "playground.approve_webhooks"]


def enqueue(script: list, *, prompt: str = "go") -> AgentRun:
    """A queued run; its wake-up commits at once (the test runs in autocommit)."""
    configuration = AgentConfigurationFactory(tools=[])
    return runs.run_enqueue(configuration=configuration, prompt=prompt, options={"script": script})


def row(run: AgentRun) -> AgentRun:
    return AgentRun.objects.get(pk=run.pk)


def status_is(run: AgentRun, *statuses: str):
    return lambda: row(run).status in statuses


def stale(run: AgentRun):
    return lambda: AgentRun.objects.filter(
        pk=run.pk, status=Status.RUNNING, lease_expires__lt=Now()
    ).exists()


def events(run: AgentRun, kind: str | None = None) -> list[AgentRunEvent]:
    queryset = AgentRunEvent.objects.filter(run=run).order_by("sequence")
    return list(queryset.filter(kind=kind) if kind else queryset)


def approve(run: AgentRun, *, mode: str = "queued") -> None:
    staff = UserFactory(permissions=APPROVER)
    runs.run_decide(
        run_uuid=run.uuid,
        actor=staff,
        approved=True,
        turn_digest=row(run).pending_turn["turn_digest"],
        mode=mode,
    )


def reap_one(run: AgentRun) -> reaper.RunVerdict:
    wait_until(stale(run), timeout=10, message="the dead holder's lease to expire")
    report = reaper.reap_stale_runs()
    [verdict] = report.verdicts
    assert verdict.run_uuid == run.uuid
    return verdict
