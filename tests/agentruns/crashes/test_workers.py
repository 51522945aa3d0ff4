"""Crashes with real processes on PostgreSQL (docs/design.md §8, §13): every crash ends in a defined
state, nothing is lost and no write runs twice.

Workers are real ``manage.py qcluster`` processes on the test database with a 2-second lease
(``AGENTRUNS_LEASE_SECONDS``); a crash is SIGKILL to the worker's whole process group. The
reaper runs in the test process (or as real ``reap_stale_runs`` processes when racing itself).
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from django_q.models import OrmQ, Task

from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import dispatch, reaper, runs
from agentruns.services.reaper import Rule, Verdict
from agentruns.services.runtime.transcript import request_messages
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.crashes import (
    APPROVER,
    approve,
    enqueue,
    events,
    reap_one,
    row,
    status_is,
)
from tests.support.processes import (
    database_url,
    process_env,
    wait_until,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

# --- helpers --------------------------------------------------------------------------------------


def tool_events(run: AgentRun, name: str) -> list[AgentRunEvent]:
    return [e for e in events(run, EventKind.TOOL) if e.payload.get("name") == name]


def assert_alive_run_is_not_reaped(run: AgentRun) -> None:
    """While its holder is alive (the ticker renews), the reaper finds nothing to do."""
    before = row(run).lease_expires
    wait_until(lambda: row(run).lease_expires > before, timeout=5, message="a lease renewal")
    report = reaper.reap_stale_runs()
    assert report.found == 0, report.verdicts


def assert_no_two_holders(run: AgentRun) -> None:
    """Within one epoch only one segment wrote; epochs never go back; sequences are contiguous."""
    stream = events(run)
    assert [e.sequence for e in stream] == list(range(len(stream)))
    segments_by_epoch: dict[int, set[str]] = defaultdict(set)
    last_epoch = 0
    for event in stream:
        if event.kind in (EventKind.REAPER, EventKind.APPROVAL):
            continue  # written by the reaper / a decider, outside any lease
        segments_by_epoch[event.lease_epoch].add(event.segment)
        assert event.lease_epoch >= last_epoch, f"epoch went back at #{event.sequence}"
        last_epoch = event.lease_epoch
    for epoch, segments in segments_by_epoch.items():
        assert len(segments) == 1, f"epoch {epoch} written by {segments}"


# --- a worker killed during a read ----------------------------------------------------------------


def test_a_worker_killed_during_a_wait_is_requeued_and_another_worker_continues_it(processes):
    run = enqueue(
        [{"tool_calls": [{"name": "wait", "arguments": {"seconds": 30}}]}, {"content": "done"}]
    )
    first = processes.qcluster("worker-a", env=process_env())
    wait_until(
        lambda: events(run, EventKind.LLM) and row(run).status == Status.RUNNING,
        timeout=60,
        message="worker A to start the wait",
        procs=[first],
    )
    assert_alive_run_is_not_reaped(run)
    holder = row(run).claimed_by

    first.kill_hard()
    verdict = reap_one(run)

    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.RECLAIM,
        Verdict.REQUEUED,
        holder,
    )
    assert row(run).status == Status.QUEUED
    second = processes.qcluster(
        "worker-b",
        env=process_env(AGENTRUNS_TOOL_TIMEOUT_SECONDS="1"),  # a short wait this time
    )
    wait_until(status_is(run, Status.COMPLETED), timeout=60, procs=[second])
    assert second.stop() == 0

    done = row(run)
    assert (done.output, done.requeue_count, done.lease_epoch) == ("done", 1, 2)
    # Continued, not restarted: turn 1 was asked once (by A); B asked only turn 2, with the
    # whole dialogue, including A's tool call and B's result for it.
    llm = events(run, EventKind.LLM)
    assert [(e.payload["iteration"], e.segment) for e in llm] == [
        (1, holder),
        (2, llm[1].segment),
    ]
    assert llm[1].segment != holder and llm[1].segment.startswith("worker:")
    [wait] = tool_events(run, "wait")
    assert (wait.lease_epoch, wait.segment) == (2, llm[1].segment)
    last_request = request_messages(run)[events(run, EventKind.REQUEST)[-1].sequence]
    assert [m["role"] for m in last_request if m["role"] != "system"] == [
        "user",
        "assistant",
        "tool",
    ]
    assert last_request[-1]["tool_call_id"] == llm[0].payload["tool_calls"][0]["id"]
    assert_no_two_holders(run)


# --- a worker killed while a non-idempotent write is in flight ------------------------------------


def test_a_worker_killed_during_a_webhook_waits_for_reconciliation_and_never_resends(
    processes, holding_server
):
    # A short django-q2 retry, so the killed attempt's task is presented again during the test.
    env = process_env(AGENTRUNS_WEBHOOK_ALLOWLIST=holding_server.netloc, Q_TIMEOUT=8, Q_RETRY=10)
    call = {"name": "call_webhook", "arguments": {"url": holding_server.url(), "payload": {"n": 1}}}
    run = enqueue([{"tool_calls": [call]}, {"content": "sent"}])
    first = processes.qcluster("worker-a", env=env)
    wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[first])
    approve(run)
    wait_until(lambda: holding_server.requests, timeout=30, message="the webhook", procs=[first])
    in_flight = row(run)
    assert in_flight.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert in_flight.pending_call["name"] == "call_webhook"

    first.kill_hard()
    verdict = reap_one(run)

    assert (verdict.rule, verdict.verdict) == (Rule.FENCE, Verdict.IN_DOUBT)
    doubt = row(run)
    assert doubt.status == Status.WAITING_FOR_RECONCILIATION
    assert doubt.pending_turn["segment"] == in_flight.claimed_by
    [request] = holding_server.requests
    assert request.headers["Idempotency-Key"] == doubt.pending_turn["idempotency_key"]
    assert request.headers["X-Fencing-Token"] == str(in_flight.lease_epoch)

    # Every automatic path gets its chance: django-q2 presents the killed attempt's task again,
    # a fresh worker is running, the reaper passes again (and redispatches nothing).
    second = processes.qcluster("worker-b", env=env)
    wait_until(
        lambda: not OrmQ.objects.exists(),
        timeout=40,
        message="the re-presented task",
        procs=[second],
    )
    wait_until(
        lambda: [t for t in Task.objects.filter(func=dispatch.TASK) if t.result == "not claimed"],
        timeout=10,
        message="the duplicate to be a no-op",
        procs=[second],
    )
    again = reaper.reap_stale_runs()
    assert (again.found, again.redispatched) == (0, 0)
    assert second.stop() == 0

    assert len(holding_server.requests) == 1
    assert row(run).status == Status.WAITING_FOR_RECONCILIATION
    assert tool_events(run, "call_webhook") == []  # the dead segment never recorded a result


# --- a worker killed while an idempotent write is in flight ---------------------------------------


def test_a_worker_killed_during_an_idempotent_write_is_requeued_and_completed(processes):
    note = Note.objects.create(title="t", body="old")
    update = {"name": "update_note", "arguments": {"id": note.pk, "body": "new"}}
    run = enqueue([{"tool_calls": [update]}, {"content": "updated"}])
    first = processes.qcluster("worker-a", env=process_env())
    wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[first])

    # Hold the note's row lock from another connection: the write blocks mid-statement.
    with psycopg.connect(database_url()) as blocker:
        blocker.execute("SELECT 1 FROM playground_note WHERE id = %s FOR UPDATE", [note.pk])
        approve(run)
        wait_until(
            lambda: row(run).pending_effect == Effect.IDEMPOTENT_WRITE,
            timeout=30,
            message="the fence of update_note",
            procs=[first],
        )
        assert_alive_run_is_not_reaped(run)
        holder = row(run).claimed_by
        first.kill_hard()
        blocker.rollback()

    verdict = reap_one(run)

    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.RECLAIM,
        Verdict.REQUEUED,
        holder,
    )
    [reaped] = events(run, EventKind.REAPER)
    assert reaped.payload["pending_effect"] == Effect.IDEMPOTENT_WRITE
    second = processes.qcluster("worker-b", env=process_env())
    wait_until(status_is(run, Status.COMPLETED), timeout=60, procs=[second])
    assert second.stop() == 0

    note.refresh_from_db()
    assert note.body == "new"
    done = row(run)
    assert (done.output, done.requeue_count) == ("updated", 1)
    # Re-executed by the new holder (it converges); the dead one never recorded a result.
    [write] = tool_events(run, "update_note")
    assert write.lease_epoch == done.lease_epoch and write.segment != holder
    assert write.payload["ok"] is True
    assert_no_two_holders(run)


# --- a web process killed during an inline (resume:) continuation ---------------------------------


def start_inline_decision(processes, run: AgentRun, env: dict[str, str]):
    """A "web" process approving inline: it continues the run under a ``resume:`` lease."""
    staff = UserFactory(permissions=APPROVER)
    digest = row(run).pending_turn["turn_digest"]
    code = (
        "from django.contrib.auth import get_user_model\n"
        "from agentruns.services import runs\n"
        f"user = get_user_model().objects.get(pk={staff.pk})\n"
        f"runs.run_decide(run_uuid={str(run.uuid)!r}, actor=user, approved=True,\n"
        f"                turn_digest={digest!r}, mode='inline')\n"
    )
    return processes.python("web", code, env=env)


def start_sync(script: list) -> AgentRun:
    configuration = AgentConfigurationFactory(tools=[])
    result = runs.run_start_sync(
        configuration=configuration, prompt="go", options={"script": script}
    )
    assert result.outcome == "awaiting_approval"
    return result.run


def test_a_web_process_killed_during_an_inline_webhook_leaves_the_run_in_doubt(
    processes, holding_server
):
    env = process_env(AGENTRUNS_WEBHOOK_ALLOWLIST=holding_server.netloc)
    call = {"name": "call_webhook", "arguments": {"url": holding_server.url(), "payload": {}}}
    # The same allowlist here as in the web process: the approver's preview ("POST … to …")
    # must be what the web process computes again before it sends (compare-and-swap).
    allowed = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [holding_server.netloc]}
    with override_settings(AGENTRUNS=allowed):
        run = start_sync([{"tool_calls": [call]}, {"content": "sent"}])
    web = start_inline_decision(processes, run, env)
    wait_until(lambda: holding_server.requests, timeout=60, message="the webhook", procs=[web])
    holder = row(run).claimed_by
    assert holder.startswith("resume:")

    web.kill_hard()
    verdict = reap_one(run)

    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.FENCE,
        Verdict.IN_DOUBT,
        holder,
    )
    assert row(run).status == Status.WAITING_FOR_RECONCILIATION
    assert reaper.reap_stale_runs().found == 0
    assert len(holding_server.requests) == 1


def test_a_web_process_killed_during_an_inline_read_is_requeued_and_a_worker_finishes(processes):
    note = Note.objects.create(title="t", body="old")
    turn = [
        {"name": "update_note", "arguments": {"id": note.pk, "body": "new"}},
        {"name": "wait", "arguments": {"seconds": 30}},
    ]
    run = start_sync([{"tool_calls": turn}, {"content": "done"}])
    web = start_inline_decision(processes, run, process_env())
    wait_until(
        lambda: tool_events(run, "update_note"), timeout=60, message="the write", procs=[web]
    )
    holder = row(run).claimed_by
    assert holder.startswith("resume:")
    assert_alive_run_is_not_reaped(run)

    web.kill_hard()
    verdict = reap_one(run)

    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.RECLAIM,
        Verdict.REQUEUED,
        holder,
    )
    worker = processes.qcluster("worker", env=process_env(AGENTRUNS_TOOL_TIMEOUT_SECONDS="1"))
    wait_until(status_is(run, Status.COMPLETED), timeout=60, procs=[worker])
    assert worker.stop() == 0

    done = row(run)
    assert done.output == "done"
    note.refresh_from_db()
    assert note.body == "new"
    # The write ran once, in the resume segment; only the unfinished read was repeated.
    [write] = tool_events(run, "update_note")
    assert write.segment == holder
    [wait] = tool_events(run, "wait")
    assert wait.segment.startswith("worker:") and wait.lease_epoch == done.lease_epoch
    assert_no_two_holders(run)


# --- two reapers at once --------------------------------------------------------------------------


def test_two_reapers_together_give_every_stale_run_exactly_one_verdict(processes):
    configuration = AgentConfigurationFactory(tools=[])
    expired = timezone.now() - timedelta(minutes=5)
    shapes = {
        0: ({"pending_effect": Effect.NON_IDEMPOTENT_WRITE}, Status.WAITING_FOR_RECONCILIATION),
        1: ({"requeue_count": 3}, Status.FAILED),
        2: ({"loop_state": {"iteration": "corrupt"}}, Status.FAILED),
        3: ({}, Status.QUEUED),
    }
    AgentRun.objects.bulk_create(
        AgentRun(
            configuration=configuration,
            prompt=f"run {n}",
            status=Status.RUNNING,
            claimed_by=f"worker:dead-host:{n}",
            lease_epoch=1,
            lease_expires=expired + timedelta(milliseconds=n),
            pending_call={"id": "call_0_0", "name": "create_note", "arguments": {}},
            **shapes[n % 4][0],
        )
        for n in range(200)
    )
    expected = {
        str(run.uuid): shapes[int(run.prompt.split()[1]) % 4][1] for run in AgentRun.objects.all()
    }

    env = process_env()
    reapers = [
        processes.manage(f"reaper-{i}", "reap_stale_runs", "--batch-size", "5", env=env)
        for i in range(2)
    ]
    for proc in reapers:
        assert proc.wait(timeout=120) == 0, proc.output()

    judged = [
        line.split()[0]
        for proc in reapers
        for line in proc.output().splitlines()
        if " verdict=" in line
    ]
    assert sorted(judged) == sorted(expected)  # each run judged once, by one of them
    assert all(" verdict=skipped" not in proc.output() for proc in reapers)
    per_run = defaultdict(int)
    for run_id in AgentRunEvent.objects.filter(kind=EventKind.REAPER).values_list(
        "run__uuid", flat=True
    ):
        per_run[str(run_id)] += 1
    assert per_run == dict.fromkeys(expected, 1)
    assert {str(u): s for u, s in AgentRun.objects.values_list("uuid", "status")} == expected
    counts = [sum(" verdict=" in line for line in p.output().splitlines()) for p in reapers]
    print(f"verdicts per reaper: {counts}")


# --- three workers over a backlog -----------------------------------------------------------------


def test_three_workers_over_200_queued_runs_finish_all_with_one_holder_each(processes):
    script = [{"tool_calls": [{"name": "list_notes"}]}, {"content": "ok"}]
    queued = [enqueue(script, prompt=f"run {n}") for n in range(200)]
    for run in queued:  # duplicates are routine: give every run a second wake-up
        dispatch.send_wakeup(str(run.uuid))
    env = process_env(AGENTRUNS_LEASE_SECONDS="10")
    workers = [processes.qcluster(f"worker-{i}", env=env) for i in range(3)]

    wait_until(
        lambda: (
            not AgentRun.objects.exclude(
                status__in=[Status.COMPLETED, Status.FAILED, Status.CANCELLED]
            ).exists()
        ),
        timeout=300,
        interval=1,
        message="every run to end",
        procs=workers,
    )
    for worker in workers:
        assert worker.stop() == 0, worker.output()[-2000:]

    assert set(AgentRun.objects.values_list("status", flat=True)) == {Status.COMPLETED}
    holders = set()
    for run in AgentRun.objects.all():
        stream = events(run)
        claims = [e for e in stream if e.kind == EventKind.LEASE]
        assert len(claims) == 1, [e.payload for e in claims]
        assert {(e.segment, e.lease_epoch) for e in stream} == {(claims[0].segment, 1)}
        assert [e.sequence for e in stream] == list(range(len(stream)))
        holders.add(claims[0].segment)
    assert len(holders) >= 2, holders  # the work was really shared between processes
    print(f"runs per holder: {json.dumps(sorted(holders))}")


# --- a worker killed while the model writes its final answer --------------------------------------


def test_a_worker_killed_during_the_final_answer_is_completed_once_by_the_next(processes):
    """Issue 11 §1 with real processes: the final answer and the completion are one write, so a
    worker SIGKILLed while the model answers leaves no half-recorded answer; the next worker asks
    again and the run completes with exactly one final answer."""
    run = enqueue(
        [
            {"tool_calls": [{"name": "list_notes", "arguments": {}}]},
            {"content": "all done", "delay": 8},
        ]
    )
    first = processes.qcluster("worker-a", env=process_env())
    wait_until(
        lambda: len(events(run, EventKind.REQUEST)) == 2,
        timeout=60,
        message="worker A to ask for the final answer",
        procs=[first],
    )
    first.kill_hard()
    verdict = reap_one(run)
    assert (verdict.rule, verdict.verdict) == (Rule.RECLAIM, Verdict.REQUEUED)
    recorded = events(run, EventKind.LLM)
    assert len(recorded) == 1 and recorded[0].payload["tool_calls"]  # only turn 1's answer

    second = processes.qcluster("worker-b", env=process_env())
    wait_until(status_is(run, Status.COMPLETED), timeout=90, procs=[second])
    assert second.stop() == 0

    done = row(run)
    assert (done.output, done.termination_reason) == ("all done", "completed")
    finals = [e for e in events(run, EventKind.LLM) if not e.payload["tool_calls"]]
    assert [e.payload["content"] for e in finals] == ["all done"]
    assert_no_two_holders(run)
