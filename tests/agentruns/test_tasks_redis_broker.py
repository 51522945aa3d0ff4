"""The Redis broker with real parts: a Redis server, real ``qcluster`` processes, PostgreSQL.

Workers get ``Q_BROKER=redis`` in their environment. The test process must send its wake-ups
through Redis too, but django-q2 reads ``Q_CLUSTER`` once, into class attributes of
``django_q.conf.Conf``, when the module is first imported: ``override_settings`` is too late.
``get_broker()`` picks the ORM broker while ``Conf.ORM`` is set and Redis (from ``Conf.REDIS``)
otherwise, so the ``redis_broker`` fixture patches those two attributes.

A dedicated Redis database (``REDIS_TEST_URL``, default DB 9) is flushed before and after each
test. Without a Redis server the tests skip locally and fail under ``CI=true``.

Redis has no acknowledgement: a worker's ``BLPOP`` removes the task, so a task whose worker died
(or that vanished from Redis before any worker took it) is gone. The reaper recovers the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import redis
from django.db.models.functions import Now
from django_q.conf import Conf
from django_q.models import OrmQ, Task

from agentruns import selectors
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import dispatch, reaper, runs
from agentruns.services.reaper import Rule, Verdict
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.broker import QUEUE_KEY
from tests.support.processes import Proc, process_env, wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

REDIS_URL = os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/9")
#: For contrast: with the ORM broker a killed attempt's task would be presented again after this.
Q_RETRY = 6


@pytest.fixture
def redis_broker(settings, monkeypatch) -> Iterator[redis.Redis]:
    """This process sends wake-ups through Redis; the test's Redis database is empty."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        message = f"needs a Redis server at {REDIS_URL} ({exc})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    client.flushdb()
    cluster = {k: v for k, v in settings.Q_CLUSTER.items() if k != "orm"}
    settings.Q_CLUSTER = {**cluster, "redis": REDIS_URL}
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", REDIS_URL)
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def worker_env(**overrides) -> dict[str, str]:
    return process_env(
        Q_BROKER="redis", REDIS_URL=REDIS_URL, Q_TIMEOUT=Q_RETRY - 1, Q_RETRY=Q_RETRY, **overrides
    )


def enqueue(script: list) -> AgentRun:
    """A queued run; its wake-up is sent at once (the test runs in autocommit)."""
    configuration = AgentConfigurationFactory(tools=[])
    return runs.run_enqueue(configuration=configuration, prompt="go", options={"script": script})


def row(run: AgentRun) -> AgentRun:
    return AgentRun.objects.get(pk=run.pk)


def tasks_for(run: AgentRun) -> list[Task]:
    """django-q2's result rows for ``run``'s wake-ups (saved whatever the broker)."""
    return [t for t in Task.objects.filter(func=dispatch.TASK) if t.args == (str(run.uuid),)]


def assert_worker_consumes(worker: Proc) -> None:
    """A probe run sent through Redis completes: ``worker`` is up and reading the queue."""
    probe = enqueue([{"content": "probe"}])
    wait_until(
        lambda: row(probe).status == Status.COMPLETED,
        timeout=180,
        message="the probe run",
        procs=[worker],
    )


def test_a_qcluster_on_redis_completes_a_run_enqueued_through_the_service(redis_broker, processes):
    run = enqueue([{"content": "done over redis"}])

    assert redis_broker.llen(QUEUE_KEY) == 1  # the wake-up went to Redis…
    assert not OrmQ.objects.exists()  # …not to the ORM broker's table
    worker = processes.qcluster(env=worker_env())
    wait_until(lambda: row(run).status == Status.COMPLETED, timeout=180, procs=[worker])
    assert worker.stop() == 0

    done = row(run)
    assert (done.output, done.lease_epoch, done.requeue_count) == ("done over redis", 1, 0)
    assert done.events.filter(kind=EventKind.LLM).get().segment.startswith("worker:")
    assert redis_broker.llen(QUEUE_KEY) == 0
    [task] = tasks_for(run)
    assert (task.success, task.result) == (True, "completed")


def test_a_task_whose_worker_was_killed_is_lost_and_the_reaper_resends_it(redis_broker, processes):
    run = enqueue(
        [{"tool_calls": [{"name": "wait", "arguments": {"seconds": 30}}]}, {"content": "done"}]
    )
    first = processes.qcluster("worker-a", env=worker_env())
    wait_until(
        lambda: row(run).status == Status.RUNNING and row(run).events.filter(kind=EventKind.LLM),
        timeout=180,
        message="worker A to start the wait",
        procs=[first],
    )
    taken = time.monotonic()
    holder = row(run).claimed_by
    assert redis_broker.llen(QUEUE_KEY) == 0  # BLPOP removed it: nothing awaits an ack

    first.kill_hard()
    killed = time.monotonic()
    second = processes.qcluster("worker-b", env=worker_env(AGENTRUNS_TOOL_TIMEOUT_SECONDS=1))
    assert_worker_consumes(second)
    # Past the lease, and past the retry after which the ORM broker would present it again.
    wait_until(
        lambda: (
            AgentRun.objects.filter(pk=run.pk, lease_expires__lt=Now()).exists()
            and time.monotonic() - taken > Q_RETRY + 1
        ),
        timeout=30,
        message="the lease and the retry period to pass",
    )

    # Lost: a live worker on the queue, yet nothing presented the task again.
    lost = row(run)
    assert (lost.status, lost.claimed_by, lost.lease_epoch) == (Status.RUNNING, holder, 1)
    assert redis_broker.llen(QUEUE_KEY) == 0
    assert tasks_for(run) == []  # the killed attempt left no result, and none ran since

    report = reaper.reap_stale_runs()
    reaped = time.monotonic()
    [verdict] = report.verdicts
    assert (verdict.rule, verdict.verdict, verdict.segment) == (
        Rule.RECLAIM,
        Verdict.REQUEUED,
        holder,
    )
    wait_until(lambda: row(run).status == Status.COMPLETED, timeout=180, procs=[second])
    completed = time.monotonic()
    assert second.stop() == 0

    done = row(run)
    assert (done.output, done.requeue_count, done.lease_epoch) == ("done", 1, 2)
    llm = list(done.events.filter(kind=EventKind.LLM).order_by("sequence"))
    assert [(e.payload["iteration"], e.segment == holder) for e in llm] == [(1, True), (2, False)]
    [task] = tasks_for(run)  # exactly one wake-up ever ran: the reaper's
    assert (task.success, task.result) == (True, "completed")
    print(
        f"\nredis crash: killed→reaped {reaped - killed:.1f}s, "
        f"reaped→completed {completed - reaped:.1f}s"
    )


def test_a_queued_run_whose_task_vanished_is_redispatched_and_completed(redis_broker, processes):
    run = enqueue([{"content": "finally"}])
    assert redis_broker.llen(QUEUE_KEY) == 1
    redis_broker.flushdb()  # the task is lost before any worker took it (e.g. Redis restarted)
    lost = time.monotonic()
    env = worker_env(AGENTRUNS_REDISPATCH_SECONDS=2)
    worker = processes.qcluster(env=env)
    assert_worker_consumes(worker)
    assert row(run).status == Status.QUEUED  # a live worker, and nothing to wake the run

    wait_until(
        lambda: selectors.unclaimed_queued_runs(older_than_seconds=2).filter(pk=run.pk).exists(),
        timeout=10,
        message="the redispatch period",
    )
    reap = processes.manage("reaper", "reap_stale_runs", env=env)
    assert reap.wait(timeout=180) == 0, reap.output()
    assert "redispatched 1 unclaimed queued run(s)" in reap.output()
    wait_until(lambda: row(run).status == Status.COMPLETED, timeout=180, procs=[worker])
    completed = time.monotonic()
    assert worker.stop() == 0

    done = row(run)
    assert (done.output, done.lease_epoch, done.requeue_count) == ("finally", 1, 0)
    [event] = done.events.filter(kind=EventKind.REAPER)
    assert event.payload["verdict"] == "redispatched"
    [task] = tasks_for(run)
    assert task.result == "completed"
    print(f"\nredis lost task: lost→completed {completed - lost:.1f}s")
