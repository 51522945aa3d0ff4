"""Retention (issue 14 §4): ``purge_runs`` deletes finished runs and their events, by the
database clock, in batches, and never a run that has not ended."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test import override_settings
from django_q.models import Schedule

from agentruns import tasks
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import retention
from agentruns.services.schedules import RETENTION_SCHEDULE, RETENTION_TASK
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory

pytestmark = pytest.mark.django_db


def finished(status: str, days_ago: float, events: int = 3, configuration=None) -> AgentRun:
    """A run in ``status`` that finished ``days_ago`` days ago by the database clock."""
    run = AgentRunFactory(
        status=status, **({"configuration": configuration} if configuration else {})
    )
    AgentRunEvent.objects.bulk_create(
        AgentRunEvent(run=run, sequence=i, kind=EventKind.LEASE, payload={"i": i})
        for i in range(events)
    )
    AgentRun.objects.filter(pk=run.pk).update(finished_at=Now() - Value(timedelta(days=days_ago)))
    return run


def purge(*args: str) -> list[str]:
    out = StringIO()
    call_command("purge_runs", *args, stdout=out)
    return out.getvalue().splitlines()


def test_only_runs_that_ended_long_enough_ago_are_deleted_with_their_events():
    configuration = AgentConfigurationFactory()
    old = [
        finished(s, 40, configuration=configuration) for s in ("completed", "failed", "cancelled")
    ]
    recent = finished(Status.COMPLETED, 5, configuration=configuration)
    # Runs that have not ended are kept however old they are, even with a (corrupt) finish time.
    alive = [
        AgentRunFactory(configuration=configuration, running=True),
        AgentRunFactory(configuration=configuration, waiting=True),
        AgentRunFactory(configuration=configuration, waiting_for_input=True),
        AgentRunFactory(configuration=configuration, in_doubt=True),
        AgentRunFactory(configuration=configuration, status=Status.QUEUED),
    ]
    AgentRun.objects.filter(pk__in=[r.pk for r in alive]).update(
        finished_at=Now() - Value(timedelta(days=400)),
        created_at=Now() - Value(timedelta(days=400)),
    )

    lines = purge("--older-than", "30")

    assert lines == [
        "removed 3 run(s) and 9 event(s) finished more than 30 day(s) ago in 1 batch(es)"
    ]
    assert not AgentRun.objects.filter(pk__in=[r.pk for r in old]).exists()
    assert not AgentRunEvent.objects.filter(run_id__in=[r.pk for r in old]).exists()
    kept = set(AgentRun.objects.values_list("pk", flat=True))
    assert kept == {recent.pk, *(r.pk for r in alive)}
    assert AgentRunEvent.objects.filter(run=recent).count() == 3


def test_a_dry_run_counts_and_deletes_nothing():
    finished(Status.COMPLETED, 3)
    finished(Status.FAILED, 3, events=0)

    assert purge("--older-than", "1", "--dry-run") == [
        "would remove 2 run(s) and 3 event(s) finished more than 1 day(s) ago"
    ]
    assert AgentRun.objects.count() == 2 and AgentRunEvent.objects.count() == 3


def test_zero_days_deletes_every_finished_run():
    configuration = AgentConfigurationFactory()
    finished(Status.COMPLETED, 0.001, configuration=configuration)
    waiting = AgentRunFactory(configuration=configuration, waiting=True)

    purge("--older-than", "0")

    assert list(AgentRun.objects.values_list("pk", flat=True)) == [waiting.pk]


def test_batches_are_reported_and_every_qualifying_run_goes():
    configuration = AgentConfigurationFactory()
    for _ in range(5):
        finished(Status.COMPLETED, 10, events=2, configuration=configuration)

    lines = purge("--older-than", "7", "--batch-size", "2", "--verbosity", "2")

    assert lines == [
        "batch: removed 2 run(s) and 4 event(s)",
        "batch: removed 2 run(s) and 4 event(s)",
        "batch: removed 1 run(s) and 2 event(s)",
        "removed 5 run(s) and 10 event(s) finished more than 7 day(s) ago in 3 batch(es)",
    ]
    assert not AgentRun.objects.exists() and not AgentRunEvent.objects.exists()


def test_ages_are_measured_on_the_database_clock():
    run = finished(Status.COMPLETED, 1)
    # An app server whose clock runs 30 days fast must not make a day-old run look old.
    with time_machine.travel(timedelta(days=30)):
        assert purge("--older-than", "7") == [
            "removed 0 run(s) and 0 event(s) finished more than 7 day(s) ago in 0 batch(es)"
        ]
    assert AgentRun.objects.filter(pk=run.pk).exists()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--older-than", "-1"],
        ["--older-than", "soon"],
        ["--older-than", "3", "--batch-size", "0"],
    ],
)
def test_bad_arguments_are_refused_before_anything_is_deleted(args):
    finished(Status.COMPLETED, 100)
    with pytest.raises(CommandError):
        call_command("purge_runs", *args, stdout=StringIO())
    assert AgentRun.objects.count() == 1


def test_the_schedule_follows_the_retention_setting():
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "RETENTION_DAYS": 30}):
        call_command("setup_schedules", stdout=StringIO())
        schedule = Schedule.objects.get(name=RETENTION_SCHEDULE)
        assert (schedule.func, schedule.minutes, schedule.repeats) == (RETENTION_TASK, 1440, -1)
        old = finished(Status.COMPLETED, 31)
        kept = finished(Status.COMPLETED, 29, configuration=old.configuration)
        assert tasks.purge_old_runs().startswith("removed 1 run(s)")
        assert list(AgentRun.objects.values_list("pk", flat=True)) == [kept.pk]

    out = StringIO()
    call_command("setup_schedules", stdout=out)  # retention off again (the default, 0)
    assert not Schedule.objects.filter(name=RETENTION_SCHEDULE).exists()
    assert "removed schedule 'agentruns: purge old runs'" in out.getvalue()
    assert tasks.purge_old_runs().startswith("retention is off")
    assert AgentRun.objects.filter(pk=kept.pk).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_purges_at_once_delete_everything_exactly_once():
    configuration = AgentConfigurationFactory()
    for _ in range(60):
        finished(Status.COMPLETED, 10, events=2, configuration=configuration)
    results: list[retention.PurgeResult] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def purger() -> None:
        try:
            barrier.wait()
            results.append(retention.runs_purge(older_than_days=1, batch_size=7))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=purger) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors
    assert sum(r.runs for r in results) == 60 and sum(r.events for r in results) == 120
    assert not AgentRun.objects.exists() and not AgentRunEvent.objects.exists()


def test_purge_runs_says_what_it_did_once_and_explains_older_than(caplog, capsys):
    finished(Status.COMPLETED, 40)
    caplog.set_level(logging.DEBUG)
    assert purge("--older-than", "30") == [
        "removed 1 run(s) and 3 event(s) finished more than 30 day(s) ago in 1 batch(es)"
    ]
    assert [r.getMessage() for r in caplog.records if "removed" in r.getMessage()] == []
    with pytest.raises(SystemExit):
        call_command("purge_runs", "--help")
    helped = " ".join(capsys.readouterr().out.split())
    assert "--older-than DAYS Delete runs that finished more than DAYS days ago" in helped
