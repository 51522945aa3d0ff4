"""In-doubt writes that settle themselves, with real processes on PostgreSQL (issue 13 §1): real
``qcluster`` workers SIGKILLed around ``create_note``'s insert, the reaper in the test process, the
check run by a worker's django-q2 task, and a real local webhook receiver.

The crash points are deterministic: another connection holds an uncommitted note with the call's
idempotency key, so the worker's insert waits on the unique index (killed there: the note never
lands); or, once the insert is let through, holds the run's row so the boundary after it waits
(killed there: the note landed, nothing recorded it).
"""

from __future__ import annotations

import contextlib
import os
import random
import time

import psycopg
import pytest
from django.test import Client

from agentruns import audit
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import reaper, runs
from agentruns.services.reaper import Rule, Verdict
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.crashes import approve, enqueue, events, reap_one, row, status_is
from tests.support.processes import database_url, process_env, wait_until
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

NOTE = {"name": "create_note", "arguments": {"title": "t", "body": "b"}}


def key_of(run: AgentRun) -> str:
    return f"{run.uuid}:{row(run).pending_turn['calls'][0]['id']}"


def someone_waits_on_a_lock() -> bool:
    """Someone on the test's own database waits for a lock (``pg_locks`` covers the whole
    cluster, which other test runs may share)."""
    with psycopg.connect(database_url(), autocommit=True) as probe:
        waiting = probe.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()
        return waiting[0] > 0


def hold_the_key(key: str) -> psycopg.Connection:
    """An open transaction holding an uncommitted note with ``key``: an insert with the same key
    waits until it ends."""
    blocker = psycopg.connect(database_url())
    blocker.execute(
        "INSERT INTO playground_note (title, body, idempotency_key, created_at, updated_at) "
        "VALUES ('blocker', '', %s, now(), now())",
        [key],
    )
    return blocker


def nobody_reconciled(run: AgentRun) -> AgentRunEvent:
    [verdict] = events(run, EventKind.RECONCILIATION)
    assert (verdict.payload["by"], verdict.actor_id, verdict.payload["decider"]) == (
        "check",
        None,
        None,
    )
    return verdict


def test_a_worker_killed_after_create_note_committed_is_completed_by_its_check(processes):
    run = enqueue([{"tool_calls": [NOTE]}, {"content": "noted"}])
    first = processes.qcluster("worker-a", env=process_env())
    wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[first])
    key = key_of(run)

    keyholder = hold_the_key(key)
    approve(run)
    wait_until(someone_waits_on_a_lock, timeout=30, message="the insert to wait", procs=[first])
    with psycopg.connect(database_url()) as rowholder:
        rowholder.execute("SELECT 1 FROM agentruns_agentrun WHERE id = %s FOR UPDATE", [run.pk])
        keyholder.rollback()  # the insert goes through and commits; the boundary waits on us
        keyholder.close()
        wait_until(
            lambda: Note.objects.filter(idempotency_key=key).exists(),
            timeout=30,
            message="the note to commit",
            procs=[first],
        )
        first.kill_hard()
        rowholder.rollback()

    verdict = reap_one(run)
    assert (verdict.rule, verdict.verdict) == (Rule.FENCE, Verdict.IN_DOUBT)
    assert row(run).pending_turn["check"]["state"] == "scheduled"
    second = processes.qcluster("worker-b", env=process_env())
    wait_until(status_is(run, Status.COMPLETED), timeout=60, procs=[second])
    assert second.stop() == 0

    assert row(run).output == "noted"
    [note] = Note.objects.all()
    assert note.idempotency_key == key
    assert nobody_reconciled(run).payload["verdict"] == "landed"
    [reconciled] = events(run, EventKind.TOOL)
    assert reconciled.payload["result"]["result"]["id"] == note.pk


def test_a_worker_killed_before_the_note_is_not_landed_and_the_call_waits_for_approval(
    processes,
):
    run = enqueue([{"tool_calls": [NOTE]}, {"tool_calls": [NOTE]}, {"content": "noted"}])
    first = processes.qcluster("worker-a", env=process_env())
    wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[first])

    keyholder = hold_the_key(key_of(run))
    approve(run)
    wait_until(someone_waits_on_a_lock, timeout=30, message="the insert to wait", procs=[first])
    first.kill_hard()  # killed inside the insert: it never commits
    keyholder.rollback()
    keyholder.close()

    assert reap_one(run).verdict == Verdict.IN_DOUBT
    second = processes.qcluster("worker-b", env=process_env())
    wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[second])
    assert second.stop() == 0

    assert Note.objects.count() == 0
    assert nobody_reconciled(run).payload["verdict"] == "not_landed"
    [reconciled] = events(run, EventKind.TOOL)
    assert reconciled.payload["outcome"] == "reconciled_not_landed"
    again = row(run).pending_turn["calls"]
    assert [c["name"] for c in again] == ["create_note"]
    assert again[0]["id"] != reconciled.payload["call_id"]  # a new call, a new card


# --- A real webhook receiver --------------------------------------------------------------------


def webhook_run(receiver: WebhookReceiver) -> AgentRun:
    call = {"name": "call_webhook", "arguments": {"url": receiver.url(), "payload": {"n": 1}}}
    return enqueue([{"tool_calls": [call]}, {"content": "sent"}])


def webhook_env(receiver: WebhookReceiver, **extra: object) -> dict[str, str]:
    return process_env(
        AGENTRUNS_WEBHOOK_ALLOWLIST=receiver.netloc, AGENTRUNS_TOOL_TIMEOUT_SECONDS=1, **extra
    )


@contextlib.contextmanager
def receiving(**options: object):
    receiver = WebhookReceiver(**options).start()  # type: ignore[arg-type]
    try:
        yield receiver
    finally:
        receiver.stop()


def test_a_receiver_that_implements_the_get_completes_the_run_with_one_delivery(processes):
    with receiving(post_delay=3) as receiver:
        run = webhook_run(receiver)
        worker = processes.qcluster("worker", env=webhook_env(receiver))
        wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[worker])
        approve(run)
        wait_until(status_is(run, Status.COMPLETED), timeout=60, procs=[worker])
        assert worker.stop() == 0
        assert len(receiver.deliveries) == 1
        assert [q[0] for q in receiver.questions] == [receiver.deliveries[0].key]
    [doubt] = events(run, EventKind.IN_DOUBT)
    assert doubt.payload["error"].startswith("outcome unknown: the request may have been sent")
    assert nobody_reconciled(run).payload["evidence"] == 'GET answered {"landed": true}'


def test_a_receiver_that_answers_500_leaves_the_run_to_a_person_with_the_answer(processes):
    with receiving(post_delay=3, get_status=500) as receiver:
        run = webhook_run(receiver)
        env = webhook_env(receiver, AGENTRUNS_RECONCILE_CHECKS=2, AGENTRUNS_RETRY_BACKOFF_SECONDS=1)
        worker = processes.qcluster("worker", env=env)
        wait_until(status_is(run, Status.WAITING_FOR_APPROVAL), timeout=60, procs=[worker])
        approve(run)
        wait_until(
            lambda: (row(run).pending_turn or {}).get("check", {}).get("state") == "left_to_person",
            timeout=90,
            message="the checks to give up",
            procs=[worker],
        )
        assert worker.stop() == 0
        assert len(receiver.deliveries) == 1
        assert len(receiver.questions) == 2

    waiting = row(run)
    assert waiting.status == Status.WAITING_FOR_RECONCILIATION
    assert [e.payload["answer"] for e in events(run, EventKind.CHECK)] == ["unknown", "unknown"]
    client = Client()
    client.force_login(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    page = client.get(f"/admin/approvals/runs/{run.uuid}/").content.decode()
    assert "The automatic check could not tell: decide yourself." in page
    assert "GET answered 500: internal error" in page


# --- Chaos: random kills, every in-doubt write settled by its check ----------------------------


def holder_of(run: AgentRun, workers: list) -> int | None:
    """The index of the cluster whose worker process holds ``run`` (``claimed_by`` ends with the
    worker's pid; its process group is the cluster's)."""
    try:
        group = os.getpgid(int(run.claimed_by.rsplit(":", 1)[1]))
    except (ValueError, IndexError, ProcessLookupError):
        return None
    return next((i for i, worker in enumerate(workers) if worker.pid == group), None)


def test_chaos_every_in_doubt_run_with_a_check_ends_without_a_person(processes):
    """Twelve queued runs each create a note while the note table is locked in random pulses (a
    fixed seed) and the worker holding a run caught in its insert is SIGKILLed there, or just
    after letting the insert through; the reaper runs throughout. Every run completes with
    a note exactly when its history says the write happened (executed, or landed), and no person
    reconciles anything: each in-doubt run's check settled it."""
    rng = random.Random(13)
    configuration = AgentConfigurationFactory(
        tools=[], script=[{"tool_calls": [NOTE]}, {"content": "noted"}]
    )
    made = [runs.run_enqueue(configuration=configuration, prompt=f"run {n}") for n in range(12)]
    env = process_env(Q_RETRY=15, Q_TIMEOUT=10)
    workers = [processes.qcluster(f"worker-{i}", env=env) for i in range(2)]
    staff = UserFactory(permissions=["agentruns.decide_agentrun"])
    deadline = time.monotonic() + 240
    kills = 0
    in_doubt = set()
    locker = psycopg.connect(database_url())
    try:
        while time.monotonic() < deadline:
            statuses = dict(AgentRun.objects.values_list("pk", "status"))
            if all(s == Status.COMPLETED for s in statuses.values()):
                break
            # Most of the time the note table is locked: approved runs block in their insert.
            pulse = rng.random() < 0.8
            if pulse:
                locker.execute("LOCK TABLE playground_note IN SHARE MODE")
            for run in AgentRun.objects.filter(status=Status.WAITING_FOR_APPROVAL):
                with contextlib.suppress(Exception):
                    runs.run_decide(
                        run_uuid=run.uuid,
                        actor=staff,
                        approved=True,
                        turn_digest=run.pending_turn["turn_digest"],
                    )
            # Until a kill has landed, wait (the table locked) for a run to block in its insert:
            # on a loaded machine a random pulse alone may never catch one, and the variant
            # would test nothing. Later pulses are as random as the seed makes them.
            settle = time.monotonic() + (30 if pulse and kills == 0 else rng.uniform(0.3, 1.0))
            while True:
                fenced = list(
                    AgentRun.objects.filter(
                        status=Status.RUNNING, pending_effect=Effect.NON_IDEMPOTENT_WRITE
                    )
                )
                if time.monotonic() >= settle or (fenced and kills == 0 and pulse):
                    break
                time.sleep(0.2)
            victim = holder_of(rng.choice(fenced), workers) if pulse and fenced else None
            if victim is not None and kills < 6:
                if rng.random() < 0.5:  # let the insert through first: it may land
                    locker.rollback()
                    time.sleep(rng.uniform(0, 0.05))
                workers[victim].kill_hard()
                workers[victim] = processes.qcluster(f"worker-{victim}-{kills}", env=env)
                kills += 1
            locker.rollback()
            report = reaper.reap_stale_runs()
            in_doubt |= {v.run_uuid for v in report.verdicts if v.verdict == Verdict.IN_DOUBT}
            time.sleep(0.3)
    finally:
        locker.close()
    for worker in workers:
        worker.stop()

    assert {r.status for r in AgentRun.objects.all()} == {Status.COMPLETED}, [
        (r.uuid, r.status) for r in AgentRun.objects.exclude(status=Status.COMPLETED)
    ]
    for run in made:
        # A note exists exactly when the run's history says the write happened: executed, or
        # found by its check (landed). Not landed: no note, and the model went on without it.
        happened = [
            e
            for e in events(run, EventKind.TOOL)
            if e.payload["outcome"] in ("executed", "reconciled_landed") and e.payload["ok"]
        ]
        notes = Note.objects.filter(idempotency_key__startswith=f"{run.uuid}:")
        assert notes.count() == len(happened) <= 1, (run.uuid, [e.payload for e in happened])
        for verdict in events(run, EventKind.RECONCILIATION):
            assert verdict.payload["by"] == "check" and verdict.actor_id is None
    reconciled = {run.uuid for run in made if events(run, EventKind.RECONCILIATION)}
    assert reconciled == in_doubt
    assert in_doubt, "no kill landed inside a write: the variant tested nothing"
    # Kills, the reaper, checks and decisions all appended events: every chain still holds.
    ledger_report = audit.verify()
    assert ledger_report.intact, [b.line() for b in ledger_report.broken]
    landed = sum(
        Note.objects.filter(idempotency_key__startswith=f"{u}:").exists() for u in in_doubt
    )
    print(
        f"kills: {kills}, in doubt: {len(in_doubt)} of {len(made)} runs, all settled by their "
        f"check ({landed} landed, {len(in_doubt) - landed} not landed)"
    )
