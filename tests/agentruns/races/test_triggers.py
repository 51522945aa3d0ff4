"""Scheduled and event-started runs under concurrency, with real threads on PostgreSQL: workers
delivering one tick at once start one run; one event delivered by racing requests starts one run
or delivers its input once, and every racer answers with that run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import AgentRun, AgentRunEvent, EventKind, ScheduledStart, Status
from agentruns.services.events import event_receive
from agentruns.services.runs import run_process_queued
from agentruns.services.scheduled_runs import schedules_start_due
from tests.agentruns.support.races import race
from tests.agentruns.support.triggers import (
    SECRET,
    SECRET_ENV,
    event_source,
    receive_kwargs,
    schedule,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RACERS = 6
ROUNDS = 3


def values(outcomes):
    errors = [o.error for o in outcomes if o.error is not None]
    assert not errors, errors
    return [o.value for o in outcomes]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_workers_delivering_one_tick_at_once_start_one_run(round_):
    now = timezone.now()
    schedule(next_run_at=now - timedelta(minutes=1), name=f"tick-{round_}")

    results = values(race([lambda: schedules_start_due(now=now)] * RACERS))

    assert sum(result.started for result in results) == 1
    assert AgentRun.objects.count() == 1
    assert ScheduledStart.objects.count() == 1


def test_workers_with_skewed_clocks_start_one_run_per_due_time():
    """Racers whose clocks disagree by seconds, across a missed stretch: one run."""
    now = timezone.now()
    schedule(next_run_at=now - timedelta(hours=2, seconds=30))
    calls = [lambda i=i: schedules_start_due(now=now + timedelta(seconds=i)) for i in range(RACERS)]

    results = values(race(calls))

    assert sum(result.started for result in results) == 1
    assert AgentRun.objects.count() == 1


@pytest.fixture
def source(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return event_source()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_one_event_delivered_by_racing_requests_starts_one_run(source, round_):
    kwargs = receive_kwargs({"id": f"evt-{round_}", "data": {"n": round_}})

    outcomes = values(race([lambda: event_receive(slug="events", **kwargs)] * RACERS))

    assert len({outcome.run_uuid for outcome in outcomes}) == 1
    assert sum(not outcome.replayed for outcome in outcomes) == 1
    assert AgentRun.objects.count() == 1


def test_one_input_event_delivered_by_racing_requests_is_given_once(source):
    started = event_receive(
        slug="events", **receive_kwargs({"id": "s", "correlation_key": "k", "data": {}})
    )
    run_process_queued(run_uuid=started.run_uuid)
    assert AgentRun.objects.get().status == Status.WAITING_FOR_INPUT
    kwargs = receive_kwargs({"id": "i", "correlation_key": "k", "input": {"answer": "blue"}})

    outcomes = values(race([lambda: event_receive(slug="events", **kwargs)] * RACERS))

    assert {outcome.run_uuid for outcome in outcomes} == {started.run_uuid}
    assert sum(not outcome.replayed for outcome in outcomes) == 1
    assert AgentRunEvent.objects.filter(kind=EventKind.INPUT).count() == 1
    assert AgentRun.objects.get().status == Status.QUEUED
