"""The operator's commands: ``reap_stale_runs``, ``cancel_run`` and ``setup_schedules``."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django_q.models import Schedule

from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services.schedules import (
    NOTIFY_SCHEDULE,
    REAPER_SCHEDULE,
    REAPER_TASK,
    RUN_SCHEDULES_SCHEDULE,
)
from tests.agentruns.factories import HOLDER, AgentRunFactory
from tests.support.processes import ROOT, process_env

pytestmark = pytest.mark.django_db


def run_command(*args: str) -> list[str]:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().splitlines()


# --- reap_stale_runs ---------------------------------------------------------------------------


def test_reap_prints_one_line_per_run_then_the_summary():
    plain = AgentRunFactory(stale=True)
    fenced = AgentRunFactory(stale=True, fenced=True)
    spent = AgentRunFactory(stale=True, requeue_count=settings.AGENTRUNS["MAX_REQUEUES"])
    broken = AgentRunFactory(stale=True, loop_state={"iteration": "x"})
    AgentRunFactory(running=True)  # alive: not mentioned

    lines = run_command("reap_stale_runs")

    assert len(lines) == 5
    by_uuid = {line.split()[0]: line for line in lines[:4]}
    assert set(by_uuid) == {str(r.uuid) for r in (plain, fenced, spent, broken)}
    assert f"segment={HOLDER} rule=reclaim verdict=requeued -> queued" in by_uuid[str(plain.uuid)]
    assert "rule=fence verdict=in_doubt -> waiting_for_reconciliation" in by_uuid[str(fenced.uuid)]
    assert (
        "rule=budget verdict=dead_lettered -> failed/retries_exhausted"
        in (by_uuid[str(spent.uuid)])
    )
    assert (
        "rule=not_rehydratable verdict=dead_lettered -> failed/not_resumable"
        in (by_uuid[str(broken.uuid)])
    )
    assert lines[4] == (
        "found 4, requeued 1, in doubt 1, dead-lettered 2, skipped 0; "
        "redispatched 0 unclaimed queued run(s)"
    )


def test_reap_with_nothing_stale_prints_an_empty_summary():
    assert run_command("reap_stale_runs") == [
        "found 0, requeued 0, in doubt 0, dead-lettered 0, skipped 0; "
        "redispatched 0 unclaimed queued run(s)"
    ]


def test_reap_dry_run_prints_the_verdicts_and_changes_nothing():
    run = AgentRunFactory(stale=True, fenced=True)

    lines = run_command("reap_stale_runs", "--dry-run")

    assert "rule=fence verdict=in_doubt" in lines[0]
    assert lines[-1].endswith("(dry run: nothing changed)")
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    assert not AgentRunEvent.objects.exists()


def test_reap_limit_judges_at_most_n_runs():
    AgentRunFactory.create_batch(3, stale=True)

    lines = run_command("reap_stale_runs", "--limit", "2")

    assert lines[-1].startswith("found 2, requeued 2,")
    assert AgentRun.objects.filter(status=Status.RUNNING).count() == 1


@pytest.mark.parametrize(
    "args",
    [["--limit", "0"], ["--limit", "-3"], ["--limit", "many"], ["--batch-size", "0"]],
)
def test_reap_refuses_bad_arguments_with_a_clear_message(args):
    with pytest.raises(CommandError, match="must be a positive integer"):
        call_command("reap_stale_runs", *args)


def test_reap_bad_arguments_exit_non_zero_from_the_command_line():
    """The real entry point: argparse's exit status and message, before any database access."""
    completed = subprocess.run(
        [sys.executable, "manage.py", "reap_stale_runs", "--limit", "zero"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert completed.returncode != 0
    assert "--limit: must be a positive integer, got 'zero'" in completed.stderr
    assert completed.stdout == ""


# --- cancel_run ---------------------------------------------------------------------------------


def test_cancel_run_cancels_a_live_run():
    run = AgentRunFactory(running=True)

    assert run_command("cancel_run", str(run.uuid)) == [f"cancelled {run.uuid}"]

    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (Status.CANCELLED, "cancelled")
    # The holder keeps its claim so that it recognises the cancel at its next boundary.
    assert run.claimed_by == HOLDER
    cancel = run.events.get(kind=EventKind.CANCEL)
    assert cancel.payload["note"] == "cancelled with manage.py cancel_run"


@pytest.mark.parametrize("ended", ["completed", "failed", "cancelled"])
def test_cancel_run_leaves_a_terminal_run_alone_and_exits_1_naming_its_status(ended):
    run = AgentRunFactory(**{ended: True})
    out = StringIO()

    with pytest.raises(CommandError) as refused:
        call_command("cancel_run", str(run.uuid), stdout=out)

    assert refused.value.returncode == 1
    assert str(refused.value) == f"{run.uuid} not cancelled: it already ended ({ended})"
    assert out.getvalue() == ""
    run.refresh_from_db()
    assert run.status == ended


def test_cancel_run_with_an_unknown_uuid_exits_2():
    with pytest.raises(CommandError, match="no run 3f1e1c1e-0000-4000-8000-000000000000") as no:
        call_command("cancel_run", "3f1e1c1e-0000-4000-8000-000000000000")
    assert no.value.returncode == 2


@pytest.mark.parametrize("raw", ["nope", "", "3f1", "3f1e1c1e-0000-4000-8000-0000000000001"])
def test_cancel_run_with_a_malformed_id_exits_2(raw):
    with pytest.raises(CommandError, match="not a run id") as bad:
        call_command("cancel_run", raw)
    assert bad.value.returncode == 2


def test_cancel_run_takes_the_short_id_the_pages_show():
    run = AgentRunFactory(running=True)
    short = str(run.uuid)[:8]
    assert run_command("cancel_run", short.upper()) == [f"cancelled {run.uuid}"]
    run.refresh_from_db()
    assert run.status == Status.CANCELLED


def test_a_short_id_that_starts_several_runs_is_refused_naming_them():
    first = AgentRunFactory(running=True, uuid="3f1e1c1e-0000-4000-8000-000000000001")
    second = AgentRunFactory(running=True, uuid="3f1e1c1e-0000-4000-9000-000000000002")
    with pytest.raises(CommandError) as ambiguous:
        call_command("cancel_run", "3f1e1c1e")
    assert ambiguous.value.returncode == 2
    assert str(ambiguous.value) == (
        f"'3f1e1c1e' is the start of more than one run ({first.uuid}, {second.uuid}): give "
        "more of its id"
    )
    # More of it names one.
    assert run_command("cancel_run", "3f1e1c1e-0000-4000-8") == [f"cancelled {first.uuid}"]
    assert run_command("cancel_run", "3f1e1c1e000040009") == [f"cancelled {second.uuid}"]
    with pytest.raises(CommandError, match="no run's id starts with 3f1e1c1e9") as none:
        call_command("cancel_run", "3f1e1c1e-9")
    assert none.value.returncode == 2


def cancel_run_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py cancel_run`` in a fresh process on this test's (committed) database."""
    if connection.vendor == "postgresql":
        env = process_env()
    else:
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}"}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.test"
    return subprocess.run(
        [sys.executable, "manage.py", "cancel_run", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_cancel_run_exit_statuses_from_the_command_line():
    run = AgentRunFactory(running=True)

    cancelled = cancel_run_process(str(run.uuid))
    assert (cancelled.returncode, cancelled.stdout) == (0, f"cancelled {run.uuid}\n")

    again = cancel_run_process(str(run.uuid))
    assert again.returncode == 1
    assert f"{run.uuid} not cancelled: it already ended (cancelled)" in again.stderr
    assert again.stdout == ""

    unknown = cancel_run_process("3f1e1c1e-0000-4000-8000-000000000000")
    assert unknown.returncode == 2
    assert "no run 3f1e1c1e-0000-4000-8000-000000000000" in unknown.stderr

    for bad in (["nope"], [], [str(run.uuid), "--colour", "red"]):
        refused = cancel_run_process(*bad)
        assert refused.returncode == 2, (bad, refused.stderr)
        assert refused.stdout == ""

    helped = cancel_run_process("--help")
    assert helped.returncode == 0
    assert "Exit status: 0 cancelled, 1 already ended" in " ".join(helped.stdout.split())


# --- setup_schedules ----------------------------------------------------------------------------


def test_setup_schedules_creates_the_reaper_schedule_once():
    first = run_command("setup_schedules")
    second = run_command("setup_schedules")

    # The reaper's, and the notification pass's (on by default; services/test_notifications.py)
    # and the run schedules' pass (services/test_scheduled_runs.py).
    [schedule] = Schedule.objects.exclude(name__in=[NOTIFY_SCHEDULE, RUN_SCHEDULES_SCHEDULE])
    assert (schedule.name, schedule.func) == (REAPER_SCHEDULE, REAPER_TASK)
    assert schedule.schedule_type == Schedule.MINUTES
    assert schedule.minutes == settings.AGENTRUNS["REAPER_INTERVAL_MINUTES"]
    assert schedule.repeats == -1
    assert first[0].startswith("created schedule")
    assert second[0].startswith("updated schedule")


def test_setup_schedules_updates_the_interval_and_keeps_the_next_run():
    run_command("setup_schedules")
    next_run = Schedule.objects.get(name=REAPER_SCHEDULE).next_run

    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "REAPER_INTERVAL_MINUTES": 5}):
        run_command("setup_schedules")

    schedule = Schedule.objects.get(name=REAPER_SCHEDULE)
    assert schedule.minutes == 5
    assert schedule.next_run == next_run


def test_the_scheduled_task_runs_one_reaper_pass():
    from agentruns import tasks

    run = AgentRunFactory(stale=True)

    summary = tasks.reap_stale_runs()

    assert summary.startswith("found 1, requeued 1,")
    run.refresh_from_db()
    assert run.status == Status.QUEUED
