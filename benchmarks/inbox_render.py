#!/usr/bin/env python
"""The approvals inbox with 500 waiting runs: queries and median render time of its first page.

    .venv/bin/python benchmarks/inbox_render.py                 # SQLite (a temporary file)
    .venv/bin/python benchmarks/inbox_render.py --waiting 500 --requests 40 --json
    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/inbox_render.py

Migrates a THROWAWAY database (a temporary SQLite file, or ``leasehold_inbox_<pid>`` on the
server of a PostgreSQL ``DATABASE_URL``), fills it with ``--waiting`` runs waiting for a person
— by thirds approvals of a write (arguments shown as a preview), input requests with a schema
form, and in-doubt writes to reconcile — spread over five configurations, two of them with an
approver group the reader is not in, and times whole ``GET /admin/approvals/`` requests of a
staff decider (the session, the middleware, the 20-card page) through Django's test client. As a
same-run baseline it times the page of a near-empty inbox (5 runs), so the figure per card is
the difference. Prints the queries per page at both sizes, the median and p90 wall times and the
median CPU time of the process per request (steadier than wall time on a shared machine).

With ``--json`` the last line is one JSON object: ``{"database", "waiting_runs", "cards",
"queries", "queries_at_5", "median_ms", "p90_ms", "median_ms_at_5", "median_cpu_ms"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import is_postgres, setup_django, throwaway_postgres

INBOX = "/admin/approvals/"
CPU_MS: list[float] = []  # the median CPU time of each size's requests, in order
ARGUMENTS = {
    "title": "Quarterly report",
    "body": "Revenue is up four percent on the quarter; costs are flat.\n" * 4,
    "tags": ["finance", "q3"],
}


@contextmanager
def throwaway_database() -> Iterator[str]:
    configured = os.environ.get("DATABASE_URL", "")
    if is_postgres(configured):
        with throwaway_postgres(configured, "leasehold_inbox") as url:
            yield url
        return
    directory = tempfile.mkdtemp(prefix="leasehold-inbox-")
    try:
        yield f"sqlite:///{os.path.join(directory, 'inbox.sqlite3')}"
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def fill(waiting: int) -> None:
    """``waiting`` runs waiting for a person, by thirds approval, input and reconciliation."""
    from django.contrib.auth.models import Group

    from agentruns.models import AgentConfiguration, AgentRun, Effect, Status
    from agentruns.turns import PendingTurn
    from agentruns.turns.calls import Call

    others = Group.objects.get_or_create(name="finance-approvers")[0]
    configurations = [
        AgentConfiguration.objects.get_or_create(
            slug=f"inbox-{i}",
            defaults={"name": f"Inbox {i}", "approver_group": others if i < 2 else None},
        )[0]
        for i in range(5)
    ]
    start = AgentRun.objects.count()
    rows = []
    for i in range(start, start + waiting):
        call_id = f"call_{i}_0"
        kind = i % 3
        if kind == 0:
            call = Call(call_id, "create_note", ARGUMENTS, Effect.NON_IDEMPOTENT_WRITE)
            status, turn = Status.WAITING_FOR_APPROVAL, PendingTurn.for_approval([call])
        elif kind == 1:
            call = Call(call_id, "ask_user", {}, Effect.READ)
            schema = {
                "type": "object",
                "properties": {
                    "amount": {"type": "integer", "minimum": 0},
                    "reason": {"type": "string", "maxLength": 200},
                    "urgent": {"type": "boolean"},
                },
                "required": ["amount"],
            }
            status, turn = Status.WAITING_FOR_INPUT, PendingTurn.for_input(call, schema)
        else:
            call = Call(call_id, "create_note", ARGUMENTS, Effect.NON_IDEMPOTENT_WRITE)
            run_turn = PendingTurn.for_approval([call])
            status, turn = (
                Status.WAITING_FOR_RECONCILIATION,
                PendingTurn(
                    kind="reconciliation", turn_digest=run_turn.turn_digest, calls=run_turn.calls
                ),
            )
        rows.append(
            AgentRun(
                configuration=configurations[i % len(configurations)],
                prompt=f"inbox run {i}",
                status=status,
                lease_epoch=1,
                pending_turn=turn.to_json(),
                pending_effect=Effect.NON_IDEMPOTENT_WRITE if kind == 2 else "",
                pending_call=call.to_json() if kind == 2 else None,
            )
        )
    AgentRun.objects.bulk_create(rows, batch_size=250)


def measure(client: Any, requests: int) -> tuple[list[float], int, int]:
    """Times of ``requests`` GETs of the inbox (after two warm-ups), its queries, its cards."""
    from django.db import connection

    for _ in range(2):
        client.get(INBOX)
    queries: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        response = client.get(INBOX)
    assert response.status_code == 200, response.status_code
    cards = response.content.decode().count('class="approvals-card ')
    times, cpu = [], []
    for _ in range(requests):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(INBOX)
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status_code == 200
    CPU_MS.append(statistics.median(cpu))
    return times, len(queries), cards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=500, help="runs waiting for a person")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per size")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()

    with throwaway_database() as url:
        setup_django(
            {
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "config.settings.local",
                "LOG_LEVEL": "WARNING",
            }
        )
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission
        from django.db import connection
        from django.test import Client

        settings.DEBUG = False  # no query log while timing; CaptureQueriesContext turns it on
        settings.ALLOWED_HOSTS = ["testserver"]
        reader = get_user_model().objects.create_user("decider", is_staff=True)
        reader.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="agentruns", codename="decide_agentrun"
            )
        )
        client = Client()
        client.force_login(reader)
        fill(5)
        small, small_queries, small_cards = measure(client, args.requests)
        fill(args.waiting - 5)
        times, queries, cards = measure(client, args.requests)

    median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
    small_median = statistics.median(small)
    print(f"database: {connection.vendor}; {args.requests} timed requests per size")
    print(f"load average (1/5/15 min): {os.getloadavg()}, {os.cpu_count()} CPUs")
    print(
        f"  5 waiting runs:   {small_cards} cards, {small_queries} queries, median "
        f"{small_median:.1f} ms (CPU {CPU_MS[0]:.1f} ms)"
    )
    print(
        f"  {args.waiting} waiting runs: {cards} cards, {queries} queries, median {median:.1f} ms "
        f"(CPU {CPU_MS[1]:.1f} ms), p90 {p90:.1f} ms "
        f"(goal: median <= 50 ms: {'met' if median <= 50 else 'NOT met'})"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "database": connection.vendor,
                    "waiting_runs": args.waiting,
                    "cards": cards,
                    "queries": queries,
                    "queries_at_5": small_queries,
                    "median_ms": round(median, 2),
                    "p90_ms": round(p90, 2),
                    "median_ms_at_5": round(small_median, 2),
                    "median_cpu_ms": round(CPU_MS[1], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
