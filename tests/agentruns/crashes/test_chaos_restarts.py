"""Chaos with real processes: the database restarted, the Redis broker restarted, mid-run.

A handful of queued webhook runs (each POSTs once to a real local receiver after a staff
approval) run on two real ``qcluster`` processes while the server under them is restarted; the
test process approves what waits and runs the reaper throughout, tolerating the outage on its own
connection. Afterwards every run has completed, the receiver got exactly one delivery per run
(counted by the ``Idempotency-Key``: nothing duplicated, nothing lost) and every run's ledger
chain holds.

* **PostgreSQL** (``-m fast`` and ``-m immediate``): a private cluster (``private_postgres``,
  never the shared one) carries the whole system — the workers, the reaper, the decisions. Each
  restart is triggered while a webhook POST is in flight (a run ``running`` with its fence
  stamped), so a segment's boundary meets a dead connection: the "database refused the write"
  path (``StateWriteFailed``), then the reaper's in-doubt rule and the webhook's check. One
  cluster keeps persistent connections (``DATABASE_CONN_MAX_AGE=60`` with health checks), the
  other opens one per task.
* **Redis** (a private ``redis-server`` keeping nothing on disk): the database is the test
  database; the broker is restarted twice, losing whatever tasks it held, and wake-ups sent
  while it is down fail. The reaper's redispatch (``AGENTRUNS_REDISPATCH_SECONDS``, 3 s here)
  sends fresh ones.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.db import Error as DatabaseError
from django.db import connection, connections
from django.test import Client
from django_q.conf import Conf
from rest_framework.authtoken.models import Token

from agentruns import audit
from agentruns.exceptions import LeaseholdError
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import reaper, runs
from agentruns.services.reaper import Verdict
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.broker import QUEUE_KEY
from tests.support.private_servers import (
    PrivatePostgres,
    PrivateRedis,
    free_port,
    private_postgres,  # noqa: F401  (fixture)
    private_redis,  # noqa: F401  (fixture)
)
from tests.support.processes import Processes, process_env, wait_until
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
]

RUNS = 8
APPROVER = ["agentruns.decide_agentrun", "playground.approve_webhooks"]
#: The reaper's redispatch period in these tests (the test process runs the reaper).
REDISPATCH_SECONDS = 3


# --- The database under the test: the private cluster -------------------------------------------


@contextlib.contextmanager
def pointed_at(server: PrivatePostgres) -> Iterator[None]:
    """The test process's default connection on ``server``'s database, then back."""
    conn = connections["default"]
    saved = dict(conn.settings_dict)
    conn.close()
    conn.settings_dict.update(
        NAME=server.DATABASE, USER=server.USER, PASSWORD="", HOST="127.0.0.1", PORT=str(server.port)
    )
    try:
        yield
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)


@pytest.fixture(scope="session")
def chaos_postgres(private_postgres, django_db_setup, django_db_blocker) -> PrivatePostgres:  # noqa: F811
    """The private cluster's database, migrated once per session."""
    with django_db_blocker.unblock(), pointed_at(private_postgres):
        call_command("migrate", verbosity=0)
    return private_postgres


@pytest.fixture
def on_chaos_postgres(chaos_postgres) -> Iterator[PrivatePostgres]:
    """The test process on the private cluster for this test (its runs stay there: each test
    counts only its own)."""
    with pointed_at(chaos_postgres):
        yield chaos_postgres


# --- The chaos run --------------------------------------------------------------------------------


def tolerant(action: Callable[[], Any]) -> Any:
    """``action`` on the test's own connection, which an outage breaks: on a database error the
    connection is dropped (the next query reconnects) and ``None`` returned."""
    try:
        return action()
    except (DatabaseError, LeaseholdError):
        with contextlib.suppress(Exception):
            connection.close()
        return None


class ChaosRun:
    """``RUNS`` queued webhook runs, the approvals they wait for and the reaper, step by step."""

    def __init__(self, receiver: WebhookReceiver) -> None:
        self.receiver = receiver
        call = {"name": "call_webhook", "arguments": {"url": receiver.url(), "payload": {}}}
        configuration = AgentConfigurationFactory(
            tools=[], script=[{"tool_calls": [call]}, {"content": "sent"}]
        )
        self.made = [
            runs.run_enqueue(configuration=configuration, prompt=f"run {n}") for n in range(RUNS)
        ]
        self.ids = [run.pk for run in self.made]
        self.staff = UserFactory(permissions=APPROVER)
        self.verdicts: Counter[str] = Counter()
        self.redispatched = 0
        self.started = time.monotonic()

    def statuses(self) -> dict[int, str]:
        return dict(AgentRun.objects.filter(pk__in=self.ids).values_list("pk", "status"))

    def done(self) -> bool:
        statuses = tolerant(self.statuses)
        return bool(statuses) and all(s == Status.COMPLETED for s in statuses.values())

    def writing(self) -> bool:
        """A webhook POST is in flight: a run is running with its fence stamped."""
        return bool(
            tolerant(
                lambda: (
                    AgentRun.objects.filter(pk__in=self.ids, status=Status.RUNNING)
                    .exclude(pending_effect="")
                    .exists()
                )
            )
        )

    def step(self) -> None:
        """Approve what waits, then one reaper pass (each tolerating an outage)."""
        waiting = tolerant(
            lambda: list(
                AgentRun.objects.filter(pk__in=self.ids, status=Status.WAITING_FOR_APPROVAL)
            )
        )
        for run in waiting or []:
            tolerant(
                lambda run=run: runs.run_decide(
                    run_uuid=run.uuid,
                    actor=self.staff,
                    approved=True,
                    turn_digest=run.pending_turn["turn_digest"],
                )
            )
        report = tolerant(reaper.reap_stale_runs)
        if report is not None:
            self.verdicts.update(str(v.verdict) for v in report.verdicts)
            self.redispatched += report.redispatched

    def assert_exactly_once(self) -> dict[str, int]:
        """Every run completed with exactly one delivery; the ledger holds. Returns figures."""
        statuses = self.statuses()
        assert set(statuses.values()) == {Status.COMPLETED}, statuses
        per_run = Counter(d.key.split(":", 1)[0] for d in self.receiver.deliveries)
        assert {str(run.uuid): per_run[str(run.uuid)] for run in self.made} == {
            str(run.uuid): 1 for run in self.made
        }
        assert sum(per_run.values()) == RUNS  # nothing delivered for anyone else either
        report = audit.verify()
        assert report.intact, [b.line() for b in report.broken]
        events = [
            e
            for run in AgentRun.objects.filter(pk__in=self.ids)
            for e in run.events.filter(kind__in=[EventKind.RECONCILIATION, EventKind.REAPER])
        ]
        return {
            "runs": RUNS,
            "deliveries": len(self.receiver.deliveries),
            "in doubt, settled by the check": sum(
                e.kind == EventKind.RECONCILIATION and e.payload.get("by") == "check"
                for e in events
            ),
            "reclaimed": self.verdicts[Verdict.REQUEUED],
            # Runs the redispatch sent a fresh task (with a 3 s period, also runs that were
            # only waiting for a free worker).
            "runs redispatched": len(
                {
                    e.run_id
                    for e in events
                    if e.kind == EventKind.REAPER and e.payload.get("verdict") == "redispatched"
                }
            ),
            "seconds": round(time.monotonic() - self.started),
        }


def run_chaos(
    chaos: ChaosRun,
    *,
    restarts: int,
    restart: Callable[[], float],
    ready_to_restart: Callable[[], bool],
    timeout: float = 300,
) -> list[float]:
    """Step ``chaos`` until every run completed; ``restart`` the server ``restarts`` times, each
    when ``ready_to_restart()`` (and some deliveries apart). Returns each restart's outage."""
    outages: list[float] = []
    deadline = time.monotonic() + timeout
    while not chaos.done():
        if time.monotonic() > deadline:
            statuses = tolerant(chaos.statuses)
            pytest.fail(f"not all runs completed in {timeout}s: {statuses}")
        due = len(chaos.receiver.deliveries) >= 1 + len(outages) * (RUNS // restarts)
        if len(outages) < restarts and due and ready_to_restart():
            outages.append(restart())
        chaos.step()
        time.sleep(0.2)
    assert len(outages) == restarts, "the run ended before every restart happened"
    return outages


def worker_logs(workers: list) -> str:
    return "\n".join(w.output() for w in workers)


# --- PostgreSQL restarted -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgresql_restart_mid_run_duplicates_nothing_and_every_run_completes(
    on_chaos_postgres, processes: Processes, settings, mode
):
    settings.AGENTRUNS = {**settings.AGENTRUNS, "REDISPATCH_SECONDS": REDISPATCH_SECONDS}
    receiver = WebhookReceiver(post_delay=1.0).start()
    try:
        chaos = ChaosRun(receiver)
        base = {
            "AGENTRUNS_WEBHOOK_ALLOWLIST": receiver.netloc,
            "AGENTRUNS_TOOL_TIMEOUT_SECONDS": 5,
            "AGENTRUNS_RETRY_BACKOFF_SECONDS": 1,
            "Q_RETRY": 15,
            "Q_TIMEOUT": 12,
        }
        workers = [
            # Persistent connections, checked before reuse: the worker's connection outlives
            # the restart and must be noticed dead and replaced.
            processes.qcluster(
                "worker-persistent",
                env=process_env(**base, DATABASE_CONN_MAX_AGE=60, DATABASE_CONN_HEALTH_CHECKS=1),
            ),
            processes.qcluster("worker-per-task", env=process_env(**base)),
        ]
        outages = run_chaos(
            chaos,
            restarts=2,
            restart=lambda: on_chaos_postgres.restart(mode, down_for=1.0),
            ready_to_restart=chaos.writing,
        )
        for worker in workers:
            assert worker.stop() == 0, worker.output()[-3000:]
        figures = chaos.assert_exactly_once()
    finally:
        receiver.stop()
    logs = worker_logs(workers)
    refused = logs.count("state write failed")
    claims = logs.count("Failed 'agentruns.tasks.process_run'")
    print(
        f"\npostgresql -m {mode}: outages {[round(o, 1) for o in outages]} s, {figures}, "
        f"segments stopped by a refused write: {refused}, claims refused: {claims}"
    )


# --- Requests while the database restarts ------------------------------------------------------


def test_requests_while_the_database_is_down_answer_503_and_the_first_after_a_restart_succeeds(
    on_chaos_postgres, processes: Processes
):
    """A real web process (``runserver``, one thread, persistent connections with health
    checks) in front of the private cluster: while the database is down the API and the pages
    answer 503 with ``Retry-After``; once it is back the next request succeeds — also the first
    one after a restart nobody saw, whose persistent connection died with the server (without
    ``DATABASE_CONN_HEALTH_CHECKS`` that request answers 503)."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    token = Token.objects.create(user=staff).key
    browser = Client()
    browser.force_login(staff)
    session = browser.cookies["sessionid"].value
    port = free_port()
    web = processes.manage(
        "web",
        "runserver",
        "--noreload",
        "--nothreading",
        f"127.0.0.1:{port}",
        env=process_env(DATABASE_CONN_MAX_AGE=60),
    )

    def get(path: str, **headers: str) -> tuple[int, str, str]:
        """(status, Retry-After, body) of a GET; 0 when the server does not answer."""
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read().decode()
                return response.status, response.headers.get("Retry-After", ""), body
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Retry-After", ""), exc.read().decode()
        except OSError:
            return 0, "", ""

    def api() -> tuple[int, str, str]:
        return get("/api/runs/", Authorization=f"Token {token}")

    def page() -> tuple[int, str, str]:
        return get("/admin/approvals/", Cookie=f"sessionid={session}")

    wait_until(lambda: api()[0] == 200, timeout=120, message="the web process", procs=[web])
    assert page()[0] == 200

    on_chaos_postgres.stop("immediate")
    try:
        down_api, down_page = api(), page()
    finally:
        on_chaos_postgres.start()

    assert down_api[:2] == (503, "5"), down_api
    assert json.loads(down_api[2])["code"] == "database_unavailable"
    assert down_page[:2] == (503, "5"), down_page
    assert "database is unavailable" in down_page[2]
    assert (api()[0], page()[0]) == (200, 200)  # a new connection once it is back
    on_chaos_postgres.restart("fast")  # nobody asks while it is down
    assert (api()[0], page()[0]) == (200, 200)  # the dead persistent connection was replaced


# --- The Redis broker restarted -------------------------------------------------------------------


@pytest.fixture
def private_redis_broker(private_redis: PrivateRedis, settings, monkeypatch) -> PrivateRedis:  # noqa: F811
    """This process sends its wake-ups through the private Redis (see test_tasks_redis_broker.py for
    why ``Conf`` is patched)."""
    cluster = {k: v for k, v in settings.Q_CLUSTER.items() if k != "orm"}
    settings.Q_CLUSTER = {**cluster, "redis": private_redis.url}
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", private_redis.url)
    return private_redis


def test_a_redis_broker_restart_loses_tasks_yet_every_run_completes_once(
    private_redis_broker: PrivateRedis, processes: Processes, settings
):
    settings.AGENTRUNS = {**settings.AGENTRUNS, "REDISPATCH_SECONDS": REDISPATCH_SECONDS}
    receiver = WebhookReceiver(post_delay=1.0).start()
    try:
        chaos = ChaosRun(receiver)
        env = process_env(
            Q_BROKER="redis",
            REDIS_URL=private_redis_broker.url,
            AGENTRUNS_WEBHOOK_ALLOWLIST=receiver.netloc,
            AGENTRUNS_TOOL_TIMEOUT_SECONDS=5,
            AGENTRUNS_RETRY_BACKOFF_SECONDS=1,
            Q_RETRY=15,
            Q_TIMEOUT=12,
        )
        workers = [processes.qcluster(f"worker-{i}", env=env) for i in range(2)]
        queue = redis.Redis.from_url(private_redis_broker.url)
        lost: list[int] = []

        def restart() -> float:
            lost.append(queue.llen(QUEUE_KEY))  # the tasks the restart is about to lose
            queue.close()
            return private_redis_broker.restart(down_for=1.0)

        outages = run_chaos(chaos, restarts=2, restart=restart, ready_to_restart=lambda: True)
        for worker in workers:
            assert worker.stop() == 0, worker.output()[-3000:]
        figures = chaos.assert_exactly_once()
    finally:
        receiver.stop()
    print(
        f"\nredis restarted: outages {[round(o, 1) for o in outages]} s, "
        f"tasks lost with it {lost}, {figures}"
    )
