#!/usr/bin/env python
"""One reaper pass over tables of 10k, 100k and 1M runs with 1% stale (docs/design.md §8.1).

    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/reaper_scale.py
    ... benchmarks/reaper_scale.py --sizes 10000,100000      # skip the million
    ... benchmarks/reaper_scale.py --json    # last line: {"sizes": [{"rows", "stale", ...}]}

Creates (and drops) a THROWAWAY PostgreSQL database ``leasehold_reaper_<pid>`` on the server of
``DATABASE_URL``; nothing else is touched. For each size the table holds, by ``id % 100``:
1 stale running run (leases expired 5 minutes ago and earlier, each at its own moment; a tenth
of them fenced mid non-idempotent write), 3 live running runs, 5 queued runs (recent, so
nothing to redispatch) and 91 completed runs. Then it prints

* the plan of the reaper's batch query (``EXPLAIN ANALYZE`` inside a rolled-back transaction):
  it must use the ``(status, lease_expires)`` index ``agentrun_status_lease``;
* the time of the selector alone (all stale rows, no lock) and of one full pass
  (``reap_stale_runs``: per batch of 200 the locked read, the rules, one guarded ``UPDATE`` per
  verdict kind, one INSERT of the ``reaper`` events, the wake-ups in one transaction; then the
  redispatch query), beside a floor measured in the same run: the same number of raw guarded
  single-row ``UPDATE``s through psycopg, one transaction each.

With ``--json`` the last line is one JSON object: ``{"sizes": [{"rows", "stale", "seconds",
"ms_per_stale_run", "index_used"}]}`` (``seconds``: the full pass).

Stale runs carry no events (rehydrating a long transcript costs one indexed read per run more).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import (
    grow_table,
    postgres_server,
    production_environment,
    raw_floor,
    reset_table,
    setup_django,
    throwaway_postgres,
)

INDEX = "agentrun_status_lease"


#: Every run's state by ``id % 100`` (``reset_table``): the target runs are the stale ones.
STATES = """
  status = CASE WHEN id % 100 < 4 THEN 'running'
                WHEN id % 100 < 9 THEN 'queued' ELSE 'completed' END,
  termination_reason = CASE WHEN id % 100 < 9 THEN '' ELSE 'completed' END,
  lease_expires = CASE
    WHEN id % 100 = 0 THEN now() - interval '5 minutes' - id * interval '1 ms'
                       WHEN id % 100 < 4 THEN now() + interval '1 hour' END,
  claimed_by = CASE WHEN id % 100 < 4 THEN 'worker:bench:' || id ELSE '' END,
  lease_epoch = CASE WHEN id % 100 < 4 THEN 1 ELSE 0 END,
  pending_effect = CASE WHEN id % 1000 = 0 THEN 'non_idempotent_write' ELSE '' END,
  pending_call = CASE WHEN id % 1000 = 0
    THEN '{"id": "call_0_0", "name": "call_webhook", "arguments": {}}'::jsonb
    END,
  pending_turn = NULL, requeue_count = 0, loop_state = '{}'::jsonb,
  updated_at = now()
"""
#: The floor: what the reaper's reclaim does to one stale run, as one raw guarded ``UPDATE``.
FLOOR_UPDATE = (
    "UPDATE {table} SET status = 'queued', claimed_by = '', "
    "requeue_count = requeue_count + 1, updated_at = now() "
    "WHERE id = %s AND status = 'running' AND lease_expires < now()"
)


def batch_plan() -> str:
    from django.db import connection, transaction

    from agentruns import selectors
    from agentruns.services.reaper import BATCH_SIZE

    with transaction.atomic():
        queryset = selectors.stale_runs().select_for_update(skip_locked=True, of=("self",))
        sql, params = queryset[:BATCH_SIZE].query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    return plan


def write_plans() -> list[str]:
    """The plans of one batch's guarded ``UPDATE``s (one per verdict kind), as the reaper sends
    them, from a batch run inside a transaction that is rolled back."""
    from django.db import connection, transaction

    from agentruns.services import reaper

    plans: list[str] = []

    def explain(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        text = sql.lstrip().upper()
        if text.startswith("WITH V") or text.startswith("UPDATE"):
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (COSTS OFF) " + sql, params)
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(explain):
        reaper._batch(size=reaper.BATCH_SIZE, after=None, identity="reaper:plan:0", dry_run=False)
        transaction.set_rollback(True)
    return plans


def time_selector() -> tuple[int, float]:
    from agentruns import selectors

    started = time.perf_counter()
    count = len(list(selectors.stale_runs().values_list("pk", flat=True)))
    return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = postgres_server("reaper_scale")

    with throwaway_postgres(server, "leasehold_reaper") as url:
        setup_django(production_environment(url))
        from agentruns.services import reaper

        rows = []
        for size in sizes:
            started = time.perf_counter()
            grow_table(size)
            stale = reset_table(STATES)
            prepared = time.perf_counter() - started
            plan = batch_plan()
            print(f"\n=== {size:,} runs, {stale:,} stale (table prepared in {prepared:.1f}s)")
            print(plan)
            if INDEX not in plan:
                print(f"!!! the batch query did NOT use {INDEX}")
            updates = write_plans()
            for update in updates:
                print(update)
            # the batch is selected through the index, and no guarded UPDATE scans the table
            plan_ok = INDEX in plan and not any(
                "Seq Scan on agentruns_agentrun" in u for u in updates
            )
            found, selector_s = time_selector()
            started = time.perf_counter()
            report = reaper.reap_stale_runs()
            pass_s = time.perf_counter() - started
            print(report.summary())
            reset_table(STATES)
            floor_s = raw_floor(url, stale, FLOOR_UPDATE)
            rows.append((size, found, selector_s, pass_s, floor_s, plan_ok))

        print("\nruns        stale   select all   one pass   per run   raw UPDATE floor   index")
        for size, found, selector_s, pass_s, floor_s, used in rows:
            print(
                f"{size:>9,} {found:>7,} {selector_s * 1000:>9.1f}ms {pass_s:>9.2f}s "
                f"{pass_s / max(found, 1) * 1000:>7.2f}ms {floor_s:>10.2f}s "
                f"({floor_s / max(found, 1) * 1000:.2f}ms/run)   {'yes' if used else 'NO'}"
            )
        if args.json:
            sizes_json = [
                {
                    "rows": size,
                    "stale": found,
                    "seconds": round(pass_s, 4),
                    "ms_per_stale_run": round(pass_s / max(found, 1) * 1000, 3),
                    "index_used": used,
                }
                for size, found, _, pass_s, _, used in rows
            ]
            print(json.dumps({"sizes": sizes_json}))


if __name__ == "__main__":
    main()
