#!/usr/bin/env python
"""Retention at scale (issue 14 §4): ``purge_runs`` over a table of finished runs, beside the
floor of two raw ``DELETE`` statements measured in the same run.

    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/purge_scale.py
    .venv/bin/python benchmarks/purge_scale.py --runs 100000          # SQLite (a temporary file)

The table is filled twice with ``--runs`` runs: nine in ten completed, failed or cancelled 40
days ago, one in ten waiting for approval (never purged), each with ``--events`` events. The
first fill is purged by ``runs_purge(older_than_days=30)`` in batches of ``--batch-size``; the
second by the floor: one ``DELETE`` of the events and one of the runs, in one transaction, with
the same conditions. On PostgreSQL a THROWAWAY database ``leasehold_purge_<pid>`` is created on
the server of ``DATABASE_URL`` and dropped; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import is_postgres, setup_django, throwaway_postgres

CHUNK = 5000


def fill(runs: int, events: int) -> int:
    """Insert ``runs`` runs with ``events`` events each; return how many are purgeable."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, EventKind, Status

    configuration, _ = AgentConfiguration.objects.get_or_create(slug="bench", name="bench")
    long_ago = timezone.now() - timedelta(days=40)
    ended = [Status.COMPLETED, Status.FAILED, Status.CANCELLED]
    purgeable = 0
    for start in range(0, runs, CHUNK):
        with transaction.atomic():
            rows = []
            for i in range(start, min(start + CHUNK, runs)):
                if i % 10 == 9:
                    rows.append(
                        AgentRun(
                            configuration=configuration,
                            prompt="p",
                            status=Status.WAITING_FOR_APPROVAL,
                        )
                    )
                else:
                    purgeable += 1
                    rows.append(
                        AgentRun(
                            configuration=configuration,
                            prompt="p",
                            status=ended[i % 3],
                            finished_at=long_ago,
                        )
                    )
            created = AgentRun.objects.bulk_create(rows)
            AgentRunEvent.objects.bulk_create(
                AgentRunEvent(run_id=run.pk, sequence=s, kind=EventKind.LEASE, payload={"s": s})
                for run in created
                for s in range(events)
            )
    return purgeable


def floor() -> float:
    """The same deletion as two raw statements in one transaction; seconds."""
    from django.db import connection, transaction

    from agentruns.models import AgentRun, AgentRunEvent

    runs, events = AgentRun._meta.db_table, AgentRunEvent._meta.db_table
    condition = "status IN ('completed', 'failed', 'cancelled') AND finished_at < %s"
    from datetime import timedelta

    from django.utils import timezone

    cutoff = timezone.now() - timedelta(days=30)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {events} WHERE run_id IN (SELECT id FROM {runs} WHERE {condition})",
            [cutoff],
        )
        cursor.execute(f"DELETE FROM {runs} WHERE {condition}", [cutoff])
    return time.perf_counter() - started


def measure(runs: int, events: int, batch_size: int) -> dict[str, float | int | str]:
    from django.db import connection

    from agentruns.models import AgentRun
    from agentruns.services.retention import runs_purge

    purgeable = fill(runs, events)
    started = time.perf_counter()
    result = runs_purge(older_than_days=30, batch_size=batch_size)
    purge_seconds = time.perf_counter() - started
    assert result.runs == purgeable, (result.runs, purgeable)
    assert AgentRun.objects.count() == runs - purgeable  # the waiting runs stay
    fill(runs, events)
    floor_seconds = floor()
    return {
        "database": connection.vendor,
        "runs": runs,
        "events_per_run": events,
        "purged_runs": purgeable,
        "batch_size": batch_size,
        "purge_seconds": round(purge_seconds, 3),
        "raw_delete_seconds": round(floor_seconds, 3),
        "ratio_to_raw": round(purge_seconds / floor_seconds, 2),
        "ms_per_1000_runs": round(purge_seconds / purgeable * 1_000_000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    environment = {"DJANGO_SETTINGS_MODULE": "config.settings.local", "LOG_LEVEL": "ERROR"}
    server = os.environ.get("DATABASE_URL", "")
    if is_postgres(server):
        with throwaway_postgres(server, "leasehold_purge") as url:
            setup_django({**environment, "DATABASE_URL": url})
            report(measure(args.runs, args.events, args.batch_size), args.json)
        return
    directory = tempfile.mkdtemp(prefix="leasehold-purge-")
    try:
        setup_django({**environment, "DATABASE_URL": f"sqlite:///{directory}/bench.sqlite3"})
        report(measure(args.runs, args.events, args.batch_size), args.json)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def report(figures: dict[str, float | int | str], as_json: bool) -> None:
    print(
        f"{figures['database']}: purged {figures['purged_runs']} of {figures['runs']} runs "
        f"({figures['events_per_run']} events each) in {figures['purge_seconds']} s, batches of "
        f"{figures['batch_size']} ({figures['ms_per_1000_runs']} ms per 1000 runs)"
    )
    print(
        f"  floor, two raw DELETEs in one transaction: {figures['raw_delete_seconds']} s "
        f"-> purge_runs takes {figures['ratio_to_raw']}x the floor"
    )
    if as_json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
