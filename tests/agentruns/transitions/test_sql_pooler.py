"""PostgreSQL behind a transaction-mode pooler (README "Running behind a connection pooler"):
a private PgBouncer started by the test, in transaction mode, in front of the test's database,
handing each transaction the server connection idle the longest (``server_round_robin``), so
consecutive transactions of one client meet different server sessions and anything that relies
on session state (a prepared statement, a cursor held across transactions) breaks every time,
not once in a while.

An approval goes through it and its write runs once; the audit trail exports and verifies
through it. Nothing is prepared on the server: each guarded statement binds its parameters in
one unnamed statement, which keeps nothing in the server session.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentruns.models import AgentRunEvent, EventKind, Status
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import digest, waiting_for_approval
from tests.support.chat_server import unused_port
from tests.support.processes import Proc, Processes, processes  # noqa: F401  (fixture)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),  # autocommit, as in production
]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SERVER_SESSIONS = 3  # server connections the pool holds, handed out in turn


@dataclass
class Pooler:
    port: int
    proc: Proc

    def url(self, dbname: str) -> str:
        user = connection.settings_dict.get("USER") or "root"
        return f"postgres://{user}@127.0.0.1:{self.port}/{dbname}"


@pytest.fixture
def pooler(processes: Processes, tmp_path: Path) -> Pooler:  # noqa: F811
    """A private PgBouncer (transaction mode, no prepared-statement support: Debian's 1.18)
    on a free port in front of the server the test database is on (as the server names itself:
    not another pooler the tests may already go through), its pool warmed to
    ``SERVER_SESSIONS`` server connections."""
    if not os.path.exists(PGBOUNCER):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PgBouncer is missing ({PGBOUNCER}): .ci/run installs Debian's pgbouncer")
        pytest.skip("needs PgBouncer (apt-get install pgbouncer)")
    db = connection.settings_dict
    with connection.cursor() as cursor:
        cursor.execute("SELECT host(inet_server_addr()), inet_server_port()")
        server_host, server_port = cursor.fetchone()
    port = unused_port()
    password = f" password={db['PASSWORD']}" if db.get("PASSWORD") else ""
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={server_host or db.get('HOST') or '127.0.0.1'} "
        f"port={server_port or db.get('PORT') or 5432} user={db.get('USER') or 'root'}{password}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "pool_mode = transaction\nauth_type = any\n"
        "server_round_robin = 1\n"  # the idle server connection used longest ago: FIFO
        f"default_pool_size = {SERVER_SESSIONS}\nmax_client_conn = 50\n"
        "logfile =\npidfile =\n" + ("user = postgres\n" if os.geteuid() == 0 else "")
        # Started as root it must drop to another user (it refuses to run as root).
    )
    proc = processes.start("pgbouncer", [PGBOUNCER, str(ini)], env=dict(os.environ))
    pooler = Pooler(port, proc)
    deadline = time.monotonic() + 15
    while True:
        try:
            psycopg.connect(pooler.url(db["NAME"]), connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if not proc.alive() or time.monotonic() > deadline:
                pytest.fail(f"PgBouncer did not start:\n{proc.output()[-2000:]}")
            time.sleep(0.1)
    # Warm the pool: as many transactions open at once as it holds server connections.
    clients = [psycopg.connect(pooler.url(db["NAME"])) for _ in range(SERVER_SESSIONS)]
    for client in clients:
        client.execute("SELECT 1")  # each opens a transaction, pinning a server connection
    for client in clients:
        client.commit()  # (closed mid-transaction, its server connection would be dropped)
        client.close()
    return pooler


@contextmanager
def through(pooler: Pooler) -> Iterator[None]:
    """Django's connections (this thread's and any opened meanwhile) go through ``pooler``."""
    db = connection.settings_dict  # the dict every thread's connection is built from
    saved = db.get("HOST"), db.get("PORT")
    connections.close_all()
    db.update(HOST="127.0.0.1", PORT=str(pooler.port))
    try:
        yield
    finally:
        connections.close_all()
        db.update(HOST=saved[0], PORT=saved[1])


def backend_pids(count: int) -> list[int]:
    pids = []
    for _ in range(count):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pids.append(cursor.fetchone()[0])
    return pids


def approve_inline(run) -> Any:
    decider = UserFactory(username="decider", permissions=["agentruns.decide_agentrun"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=decider).key}")
    return client.post(
        f"/api/runs/{run.uuid}/decision/",
        {"approved": True, "turn_digest": digest(run), "mode": "inline"},
        format="json",
    )


def test_consecutive_transactions_meet_different_server_sessions(pooler: Pooler):
    """The rig: one client's consecutive autocommit statements run on different backends, so a
    test passing through it relies on no session state."""
    with through(pooler):
        pids = backend_pids(SERVER_SESSIONS)
    assert len(set(pids)) == SERVER_SESSIONS, pids


def test_an_approval_through_the_pooler_succeeds_with_the_default_settings(pooler: Pooler):
    with through(pooler):
        run = waiting_for_approval()
        response = approve_inline(run)
        assert response.status_code == 200, response.content
        assert response.json()["status"] == Status.COMPLETED
    # The write ran once, recorded once, approved once.
    assert Note.objects.count() == 1
    events = AgentRunEvent.objects.filter(run=run)
    assert events.filter(kind=EventKind.APPROVAL).count() == 1
    [tool] = events.filter(kind=EventKind.TOOL)
    assert tool.payload["outcome"] == "executed", tool.payload


def completed_run() -> tuple[Any, list[tuple[int, str]]]:
    run = waiting_for_approval()
    assert approve_inline(run).status_code == 200
    events = AgentRunEvent.objects.filter(run=run).order_by("sequence")
    return run, list(events.values_list("sequence", "hash"))


def test_the_audit_export_reads_pages_through_the_pooler(pooler: Pooler, monkeypatch):
    """The export holds no cursor between statements: each page is its own query (a cursor
    declared in autocommit outlives its transaction and is fetched from another session)."""
    from agentruns import audit

    monkeypatch.setattr(audit, "EVENTS_PER_FETCH", 2)  # several pages
    with through(pooler):
        run, expected = completed_run()
        client = APIClient()
        client.force_login(
            UserFactory(username="auditor", permissions=["agentruns.view_all_agentruns"])
        )
        response = client.get(f"/api/runs/{run.uuid}/audit/")
        assert response.status_code == 200
        lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert len(expected) > 2 and lines[0]["events"] == len(expected)
    assert [(line["sequence"], line["hash"]) for line in lines[1:]] == expected


def test_the_ledger_verifies_through_the_pooler(pooler: Pooler, monkeypatch):
    """The verification's server-side cursor lives inside a transaction: every fetch meets the
    session that declared it."""
    from agentruns import audit

    monkeypatch.setattr(audit, "EVENTS_PER_FETCH", 2)  # several fetches
    with through(pooler):
        run, expected = completed_run()
        out = io.StringIO()
        call_command("verify_ledger", "--run", str(run.uuid), stdout=out)
    assert f"1 runs, {len(expected)} events intact" in out.getvalue(), out.getvalue()


@pytest.mark.own_session
def test_nothing_is_prepared_in_the_server_session():
    """What makes the pooler safe: a whole approval flow (suspend, decision, fenced write,
    settle) leaves no prepared statement in the server session it ran on (read on a direct
    connection: behind a pooler the query would meet any session)."""
    connection.close()  # a session of its own
    run = waiting_for_approval()
    assert approve_inline(run).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0
