"""The lease on every segment: loss between steps, the ticker during long calls, a killed process.

Races and crashes use real threads and processes on PostgreSQL; the lease-lost-between-steps
case also runs on SQLite by reclaiming inside a tool body on the segment's own connection.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from agentruns import transitions
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status, TerminationReason
from agentruns.services.runs import run_cancel, run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from agentruns.services.runtime.transcript import proposed_arguments
from tests.agentruns.support.leases import OTHER_WORKER, take_over
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    call,
    config,
    db_now,
    decide_inline,
    events,
    sent,
    tool_turn,
)

REPO = Path(__file__).resolve().parents[4]


def short_lease(seconds: float):
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEASE_SECONDS": seconds})


def _wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def _requesting(configuration, field: str):
    """Wait until the run of ``configuration`` has recorded a provider request; its ``field``."""
    return _wait_for(
        lambda: (
            AgentRun.objects.filter(configuration=configuration, events__kind=EventKind.REQUEST)
            .values_list(field, flat=True)
            .first()
        )
    )


def _canceller(configuration) -> threading.Thread:
    """A thread (not started) that cancels the run of ``configuration`` once it asked the model."""

    def cancel() -> None:
        try:
            run_uuid = _requesting(configuration, "uuid")
            run_cancel(run_uuid=run_uuid, note="from another thread")
        finally:
            connections.close_all()

    return threading.Thread(target=cancel)


# --- Lease lost between two steps (both databases) ------------------------------------------


@pytest.mark.django_db
def test_a_segment_whose_lease_was_taken_stops_and_the_new_holder_finishes(probes):
    taken: dict = {}

    def take_during_first_call(entry):
        if not taken:
            taken["lease"] = take_over(AgentRun.objects.get().pk)
            taken["events_after_take"] = AgentRunEvent.objects.count()

    probes.during = take_during_first_call
    script = [
        tool_turn(call("probe_read", value="a")),
        tool_turn(call("probe_read", value="b")),
        {"content": "done"},
    ]

    old = run_start_sync(configuration=config(), prompt="p", options={"script": script})

    run = old.run
    assert old.outcome == Outcome.LEASE_LOST
    # The zombie settled nothing and wrote nothing after the takeover.
    assert AgentRunEvent.objects.filter(run=run).count() == taken["events_after_take"]
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    assert run.claimed_by == OTHER_WORKER
    assert run.lease_epoch == 2
    assert run.termination_reason == ""
    zombie = [e for e in events(run) if e.lease_epoch == 1 and e.segment.startswith("interactive")]
    assert EventKind.TOOL not in [e.kind for e in zombie]

    new = continue_segment(taken["lease"])

    assert new.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert run.status == Status.COMPLETED and run.output == "done"
    assert_released(run)
    stream = assert_contiguous(run)
    tools_done = [e for e in stream if e.kind == EventKind.TOOL]
    proposed = proposed_arguments(stream)
    assert [
        (proposed[e.payload["call_id"]]["value"], e.segment, e.lease_epoch) for e in tools_done
    ] == [
        ("a", OTHER_WORKER, 2),
        ("b", OTHER_WORKER, 2),
    ]
    # The read was interrupted, so it ran again under the new holder (reads converge).
    assert [s["arguments"]["value"] for s in probes.seen] == ["a", "a", "b"]
    assert [s["fencing_token"] for s in probes.seen] == [1, 2, 2]


@pytest.mark.django_db
def test_a_zombie_write_never_starts_after_its_lease_was_taken(probes):
    """The lease moves between the read and the write of one approved turn: the write's fence
    stamp matches no row, so the body never runs and the zombie writes no event."""
    taken: dict = {}

    def take_during_read(entry):
        if entry["tool"] == "probe_read" and not taken:
            taken["lease"] = take_over(AgentRun.objects.get().pk)
            taken["count"] = AgentRunEvent.objects.count()

    script = [
        tool_turn(call("probe_read", value="r"), call("probe_write", value="w")),
        {"content": "done"},
    ]
    suspended = run_start_sync(configuration=config(), prompt="p", options={"script": script})
    probes.during = take_during_read

    old = decide_inline(suspended.run)

    assert old.outcome == Outcome.LEASE_LOST
    assert [s["tool"] for s in probes.seen] == ["probe_read"]
    assert AgentRunEvent.objects.count() == taken["count"]
    probes.during = None

    new = continue_segment(taken["lease"])

    assert new.outcome == Outcome.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_read", "probe_read", "probe_write"]
    assert probes.seen[-1]["row"]["claimed_by"] == OTHER_WORKER
    assert probes.seen[-1]["row"]["pending_effect"] == "idempotent_write"


# --- Real threads and processes (PostgreSQL) -------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lease_taken_during_a_provider_call_from_another_connection(scripted_recordings):
    script = [{"content": "slow", "delay": 1.0, "tool_calls": [call("list_notes")]}]
    script.append({"content": "done"})
    configuration = config(tools=["list_notes"])
    taken: dict = {}

    def reaper_and_worker():
        try:
            run_id = _requesting(configuration, "pk")
            taken["lease"] = take_over(run_id)
            taken["count"] = AgentRunEvent.objects.filter(run_id=run_id).count()
        finally:
            connections.close_all()

    thread = threading.Thread(target=reaper_and_worker)
    thread.start()
    old = run_start_sync(configuration=configuration, prompt="p", options={"script": script})
    thread.join()

    assert old.outcome == Outcome.LEASE_LOST
    run = old.run
    assert AgentRunEvent.objects.filter(run=run).count() == taken["count"]
    assert EventKind.LLM not in [e.kind for e in events(run)]  # the zombie's answer is not kept
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.claimed_by == OTHER_WORKER

    new = continue_segment(taken["lease"])

    assert new.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert_contiguous(run)
    assert_released(run)
    # The new holder asked the provider the same first question the zombie asked.
    assert sent(run)[0] == sent(run)[1]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_wait_longer_than_the_lease_keeps_it_alive():
    lease_seconds = 1.5
    configuration = config(tools=["wait"])
    script = [tool_turn(call("wait", seconds=3 * lease_seconds)), {"content": "rested"}]
    stop = threading.Event()
    attempts: list[bool] = []
    observed: list = []

    def reaper():
        try:
            run_id = _wait_for(
                lambda: (
                    AgentRun.objects.filter(configuration=configuration)
                    .values_list("pk", flat=True)
                    .first()
                )
            )
            while not stop.is_set():
                attempts.append(
                    transitions.run_reclaim_stale(
                        run_id=run_id,
                        segment="reaper:test:1",
                        event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
                    )
                )
                observed.append(
                    AgentRun.objects.filter(pk=run_id).values_list("lease_expires", flat=True)[0]
                )
                time.sleep(0.1)
        finally:
            connections.close_all()

    thread = threading.Thread(target=reaper)
    with short_lease(lease_seconds):
        thread.start()
        try:
            result = run_start_sync(
                configuration=configuration, prompt="p", options={"script": script}
            )
        finally:
            stop.set()
            thread.join()

    assert result.outcome == Outcome.COMPLETED, result.detail
    assert len(attempts) >= 10  # the reaper really tried throughout the wait
    assert not any(attempts)  # and never found the run stale
    renewals = {value for value in observed if value is not None}
    assert len(renewals) >= 3  # the ticker moved the lease forward during the wait
    tool_event = next(e for e in events(result.run) if e.kind == EventKind.TOOL)
    assert tool_event.payload["ok"] is True
    assert tool_event.duration_ms >= 3 * lease_seconds * 1000 * 0.9


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancel_during_a_long_call_is_noticed_as_a_cancel(scripted_recordings):
    """The ticker's renewal fails because of a cancel: the segment reports and records the
    cancel (not a lost lease), and makes no further call."""
    configuration = config(tools=["list_notes"])
    script = [{"tool_calls": [call("list_notes")], "delay": 1.5}, {"content": "never"}]

    thread = _canceller(configuration)
    with short_lease(0.9):
        thread.start()
        result = run_start_sync(configuration=configuration, prompt="p", options={"script": script})
        thread.join()

    run = result.run
    assert result.outcome == Outcome.CANCELLED
    assert run.status == Status.CANCELLED
    assert run.termination_reason == TerminationReason.CANCELLED
    assert len(sent(run)) == 1
    stream = assert_contiguous(run)
    # The answer that arrived is recorded with the cancel notice; its tool call never ran.
    assert [e.kind for e in stream] == [
        EventKind.LEASE,
        EventKind.REQUEST,
        EventKind.CANCEL,
        EventKind.LLM,
        EventKind.CANCEL,
    ]
    assert stream[-1].segment.startswith("interactive:")
    assert_released(run)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancel_during_a_provider_delay_stops_at_the_next_boundary(scripted_recordings):
    configuration = config(tools=["list_notes"])
    script = [{"tool_calls": [call("list_notes")], "delay": 0.8}, {"content": "never"}]

    thread = _canceller(configuration)
    thread.start()
    result = run_start_sync(configuration=configuration, prompt="p", options={"script": script})
    thread.join()

    run = result.run
    assert result.outcome == Outcome.CANCELLED
    assert len(sent(run)) == 1
    kinds = [e.kind for e in assert_contiguous(run)]
    assert EventKind.TOOL not in kinds
    assert kinds[-3:] == [EventKind.CANCEL, EventKind.LLM, EventKind.CANCEL]
    assert_released(run)


SEGMENT_SCRIPT = """
from agentruns.services.runs import run_start_sync
run_start_sync(
    configuration={slug!r},
    prompt="sleep in a real process",
    options={{"script": [
        {{"tool_calls": [{{"name": "wait", "arguments": {{"seconds": 25}}}}]}},
        {{"content": "never reached"}},
    ]}},
)
"""


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_process_leaves_a_lease_that_expires_within_one_lease_length():
    lease_seconds = 2
    configuration = config(tools=["wait"])
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": _database_url(connection.settings_dict["NAME"]),
        "AGENTRUNS_LEASE_SECONDS": str(lease_seconds),
        "LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            SEGMENT_SCRIPT.format(slug=configuration.slug),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # The segment is inside the wait and its ticker renews the lease.
        run_id = _wait_for(
            lambda: (
                AgentRun.objects.filter(configuration=configuration, events__kind=EventKind.LLM)
                .values_list("pk", flat=True)
                .first()
            ),
            timeout=60,
        )
        renewals = set()

        def renewed_twice():
            renewals.add(AgentRun.objects.values_list("lease_expires", flat=True).get(pk=run_id))
            return len(renewals) >= 3

        _wait_for(renewed_twice, timeout=4 * lease_seconds, interval=0.1)
        assert process.poll() is None, process.stderr.read().decode()
        # Alive and renewing: a reclaim finds nothing.
        assert not transitions.run_reclaim_stale(
            run_id=run_id,
            segment="reaper:test:1",
            event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        process.stderr.close()

    killed_at = db_now()
    run = AgentRun.objects.get(pk=run_id)
    assert run.status == Status.RUNNING and run.claimed_by.startswith("interactive:")
    # The last renewal happened before the kill, so the lease ends within one lease length.
    assert run.lease_expires <= killed_at + timedelta(seconds=lease_seconds)

    def reclaimed():
        return transitions.run_reclaim_stale(
            run_id=run_id,
            segment="reaper:test:1",
            event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
        )

    _wait_for(reclaimed, timeout=3 * lease_seconds, interval=0.1)
    run.refresh_from_db()
    assert run.status == Status.QUEUED
    assert run.requeue_count == 1
    assert run.claimed_by == ""


def _database_url(name: str) -> str:
    settings_dict = connection.settings_dict
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{name}"
