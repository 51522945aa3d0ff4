"""Scheduled runs: each due time starts one run, whoever delivers the tick and however often; a
missed stretch starts one run; a start the initiator may no longer make is skipped and logged."""

from __future__ import annotations

import logging
from datetime import timedelta

import django_q.scheduler
import pytest
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signing import SignedPackage

from agentruns import tasks
from agentruns.models import AgentRun, RunSchedule, ScheduledStart, StartOutcome, Status
from agentruns.services import scheduled_runs, schedules
from agentruns.services.scheduled_runs import schedule_tick, schedules_start_due
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.triggers import schedule

pytestmark = pytest.mark.django_db


def test_a_due_schedule_starts_one_queued_run_as_its_initiator():
    now = timezone.now()
    timed = schedule(next_run_at=now - timedelta(minutes=1))

    result = schedules_start_due(now=now)

    assert (result.started, result.skipped) == (1, 0)
    [run] = AgentRun.objects.all()
    assert (run.status, run.prompt, run.initiator_id) == (
        Status.QUEUED,
        "summarise the night",
        timed.initiator_id,
    )
    [start] = ScheduledStart.objects.all()
    assert (start.outcome, start.run_uuid, start.scheduled_for) == (
        StartOutcome.STARTED,
        run.uuid,
        now - timedelta(minutes=1),
    )
    timed.refresh_from_db()
    assert timed.next_run_at == now - timedelta(minutes=1) + timedelta(hours=1)


def test_a_tick_delivered_twice_starts_one_run():
    now = timezone.now()
    schedule(next_run_at=now - timedelta(seconds=5))

    first = schedules_start_due(now=now)
    second = schedules_start_due(now=now + timedelta(seconds=1))

    assert (first.started, second.started) == (1, 0)
    assert AgentRun.objects.count() == 1


def test_a_stale_read_of_the_same_due_time_starts_nothing_again():
    """A second pass that read the schedule before the first moved it on: its guarded update
    matches nothing. Even if ``next_run_at`` is put back, the unique (schedule, due time) record
    refuses a second start."""
    now = timezone.now()
    due = now - timedelta(seconds=5)
    timed = schedule(next_run_at=due)
    stale = RunSchedule.objects.get(pk=timed.pk)  # read before the first pass

    assert schedule_tick(schedule=timed, now=now) == "started"
    assert schedule_tick(schedule=stale, now=now) == "taken"
    RunSchedule.objects.filter(pk=timed.pk).update(next_run_at=due)  # an operator put it back
    assert schedule_tick(schedule=RunSchedule.objects.get(pk=timed.pk), now=now) == "taken"

    assert AgentRun.objects.count() == 1
    assert ScheduledStart.objects.count() == 1


def test_a_missed_stretch_starts_one_run_for_the_latest_due_time():
    now = timezone.now()
    due = now - timedelta(hours=3, minutes=10)  # the worker was down for 3 intervals and more
    timed = schedule(next_run_at=due)

    assert schedules_start_due(now=now).started == 1
    assert schedules_start_due(now=now + timedelta(minutes=1)).started == 0

    [start] = ScheduledStart.objects.all()
    assert start.scheduled_for == due + timedelta(hours=3)
    timed.refresh_from_db()
    assert timed.next_run_at == due + timedelta(hours=4)
    assert AgentRun.objects.count() == 1


def test_a_new_schedule_is_timed_first_and_starts_nothing_yet():
    now = timezone.now()
    timed = schedule(next_run_at=None)

    result = schedules_start_due(now=now)

    assert (result.timed, result.started) == (1, 0)
    timed.refresh_from_db()
    assert timed.next_run_at == now + timedelta(hours=1)
    assert not AgentRun.objects.exists()


def test_a_disabled_schedule_starts_nothing():
    schedule(next_run_at=timezone.now() - timedelta(minutes=1), enabled=False)
    assert schedules_start_due().started == 0
    assert not AgentRun.objects.exists()


def test_an_initiator_without_permission_is_skipped_logged_and_the_schedule_moves_on(caplog):
    now = timezone.now()
    timed = schedule(next_run_at=now - timedelta(minutes=1), permitted=False)
    caplog.set_level(logging.WARNING, logger="agentruns.services.scheduled_runs")

    result = schedules_start_due(now=now)

    assert (result.started, result.skipped) == (0, 1)
    assert not AgentRun.objects.exists()
    [start] = ScheduledStart.objects.all()
    assert start.outcome == StartOutcome.SKIPPED
    assert "agentruns.start_agentrun" in start.note
    assert "hourly" in caplog.text and "skipped" in caplog.text
    timed.refresh_from_db()
    assert timed.next_run_at > now  # not retried at every tick


def test_the_permission_is_read_again_at_each_start():
    now = timezone.now()
    timed = schedule(next_run_at=now - timedelta(minutes=1))
    timed.initiator.user_permissions.clear()
    assert schedules_start_due(now=now).skipped == 1
    timed.initiator.is_active = False
    timed.initiator.save()
    RunSchedule.objects.filter(pk=timed.pk).update(next_run_at=now)
    assert scheduled_runs.start_refusal(RunSchedule.objects.get(pk=timed.pk)) is not None


def test_a_deactivated_configuration_skips_its_schedules():
    now = timezone.now()
    configuration = AgentConfigurationFactory(slug="gone", is_active=False)
    schedule(configuration=configuration, next_run_at=now - timedelta(minutes=1))
    assert schedules_start_due(now=now).skipped == 1
    assert not AgentRun.objects.exists()


def test_a_prompt_the_request_rules_refuse_is_skipped_with_the_reason():
    now = timezone.now()
    schedule(next_run_at=now - timedelta(minutes=1), prompt="x" * 1_000_000)
    assert schedules_start_due(now=now).skipped == 1
    assert "AGENTRUNS_MAX_PROMPT_CHARS" in ScheduledStart.objects.get().note


def test_a_cron_schedule_starts_at_its_minute():
    now = timezone.now().replace(second=30, microsecond=0)
    minute = now.replace(second=0)
    schedule(kind="cron", cron="* * * * *", interval_seconds=None, next_run_at=minute)
    assert schedules_start_due(now=now).started == 1
    assert ScheduledStart.objects.get().scheduled_for == minute
    assert RunSchedule.objects.get().next_run_at == minute + timedelta(minutes=1)


def test_django_q2s_scheduler_drives_the_pass_and_a_duplicated_task_starts_one_run(monkeypatch):
    """The real scheduler enqueues the pass ``setup_schedules`` made; the task, delivered twice
    (a retried or duplicated delivery), starts one run."""
    # The scheduler closes old connections first, which would close the test's own.
    monkeypatch.setattr(django_q.scheduler, "close_old_django_connections", lambda: None)
    schedules.schedules_setup()
    Schedule.objects.filter(name=schedules.RUN_SCHEDULES_SCHEDULE).update(
        next_run=timezone.now() - timedelta(seconds=1)
    )
    schedule(next_run_at=timezone.now() - timedelta(seconds=1))
    OrmQ.objects.all().delete()

    scheduler(broker=get_broker())

    packages = [SignedPackage.loads(row.payload) for row in OrmQ.objects.all()]
    [task] = [p for p in packages if p["func"] == schedules.RUN_SCHEDULES_TASK]
    assert task["func"] == "agentruns.tasks.start_scheduled_runs"
    summaries = [tasks.start_scheduled_runs(*task["args"], **task["kwargs"]) for _ in range(2)]
    assert summaries[0].startswith("1 scheduled runs started")
    assert summaries[1].startswith("0 scheduled runs started")
    assert AgentRun.objects.filter(status=Status.QUEUED).count() == 1


def test_a_schedule_written_around_its_validation_is_skipped_and_the_others_go_on(caplog):
    now = timezone.now()
    broken = schedule(next_run_at=now - timedelta(minutes=1), name="broken")
    RunSchedule.objects.filter(pk=broken.pk).update(kind="cron", cron="not cron")
    schedule(
        configuration=broken.configuration, next_run_at=now - timedelta(minutes=1), name="fine"
    )

    result = schedules_start_due(now=now)

    assert (result.started, result.skipped) == (1, 1)
    assert "cannot be followed" in caplog.text


def test_a_pass_dying_after_it_took_the_tick_leaves_it_for_the_next(monkeypatch):
    """The worst gap: the due time moved on and its start recorded, and the process dies before
    the run is inserted. Nothing of it committed: the next pass starts the one run."""
    now = timezone.now()
    timed = schedule(next_run_at=now - timedelta(minutes=1))

    def die(**kwargs):
        raise ProcessDied()

    with monkeypatch.context() as patched:
        patched.setattr(scheduled_runs.runs, "run_enqueue", die)
        with pytest.raises(ProcessDied):
            schedules_start_due(now=now)

    timed.refresh_from_db()
    assert timed.next_run_at == now - timedelta(minutes=1)
    assert not ScheduledStart.objects.exists()
    assert schedules_start_due(now=now).started == 1
    assert AgentRun.objects.count() == 1
