#!/usr/bin/env python
"""The reaper's approval-deadline part over tables of 10k and 100k runs (docs/design.md §5.11).

    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/deadline_pass.py
    ... benchmarks/deadline_pass.py --sizes 10000      # one size
    ... benchmarks/deadline_pass.py --json    # last line: {"sizes": [{"rows", "overdue", ...}]}

Creates (and drops) a THROWAWAY PostgreSQL database ``leasehold_deadline_<pid>`` on the server of
``DATABASE_URL``; nothing else is touched. For each size the table holds, by ``id % 100``:
1 run waiting for approval past its deadline (half ``deny``, half ``fail``), 4 runs waiting
with a deadline ahead, 5 waiting without one and 90 completed runs. Then it prints

* the plan of the selector (``overdue_waiting_runs``, limited as a pass reads it): it must use
  the ``(status, approval_deadline)`` index ``agentrun_status_deadline``;
* the time of one pass's deadline part (``deadline_sweep.expire_overdue``: up to ``EXPIRE_LIMIT``
  runs, each settled by ``run_expire_waiting`` in its own transaction — locked read, guarded
  ``UPDATE``, one chained event — and the denied ones woken), beside a floor measured in the
  same run: as many raw guarded single-row ``UPDATE``s through psycopg, one transaction each.

With ``--json`` the last line is one JSON object: ``{"sizes": [{"rows", "overdue", "settled",
"seconds", "ms_per_run", "floor_ms_per_run", "index_used"}]}``.
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

INDEX = "agentrun_status_deadline"


#: Every run's state by ``id % 100`` (``reset_table``, with the waiting turn as the one
#: parameter): the target runs are the overdue ones.
STATES = """
  status = CASE WHEN id %% 100 < 10 THEN 'waiting_for_approval' ELSE 'completed' END,
  termination_reason = CASE WHEN id %% 100 < 10 THEN '' ELSE 'completed' END,
  approval_deadline = CASE
    WHEN id %% 100 = 0 THEN now() - interval '1 minute' - id * interval '1 ms'
    WHEN id %% 100 < 5 THEN now() + interval '1 hour' END,
  approval_timeout_action = CASE
    WHEN id %% 100 = 0 AND id %% 200 = 0 THEN 'fail'
    WHEN id %% 100 < 5 THEN 'deny' ELSE '' END,
  pending_turn = CASE WHEN id %% 100 < 10 THEN %s::jsonb END,
  claimed_by = '', lease_expires = NULL, lease_epoch = 1, pending_effect = '',
  pending_call = NULL, loop_state = '{}'::jsonb, finished_at = NULL,
  ledger_head = '', updated_at = now()
"""
#: The floor: what settling one overdue run changes, as one raw guarded ``UPDATE``.
FLOOR_UPDATE = (
    "UPDATE {table} SET status = 'queued', pending_turn = NULL, updated_at = now() "
    "WHERE id = %s AND status = 'waiting_for_approval' AND approval_deadline < now()"
)


def reset_states() -> int:
    """Put every row in its state by ``id % 100`` (``STATES``); forget events and queued tasks.
    Returns the number of overdue runs."""
    from agentruns.turns import turn_digest

    calls = [{"id": "call_0_0", "name": "create_note", "arguments": {"title": "t", "body": "b"}}]
    turn = {
        "kind": "approval",
        "calls": [{**c, "effect": "non_idempotent_write", "known": True} for c in calls],
        "turn_digest": turn_digest(calls),
    }
    return reset_table(STATES, [json.dumps(turn)])


def selector_plan() -> str:
    from django.db import connection

    from agentruns import selectors
    from agentruns.services.deadline_sweep import EXPIRE_LIMIT

    queryset = selectors.overdue_waiting_runs().values_list("pk", flat=True)[:EXPIRE_LIMIT]
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = postgres_server("deadline_pass")

    with throwaway_postgres(server, "leasehold_deadline") as url:
        setup_django(production_environment(url))
        from agentruns.services import deadline_sweep

        rows = []
        for size in sizes:
            started = time.perf_counter()
            grow_table(size)
            overdue = reset_states()
            prepared = time.perf_counter() - started
            plan = selector_plan()
            print(f"\n=== {size:,} runs, {overdue:,} overdue (prepared in {prepared:.1f}s)")
            print(plan)
            used = INDEX in plan
            if not used:
                print(f"!!! the selector did NOT use {INDEX}")
            started = time.perf_counter()
            outcomes = deadline_sweep.expire_overdue(identity="reaper:bench:0")
            pass_s = time.perf_counter() - started
            settled = sum(1 for o in outcomes if o.taken)
            reset_states()
            floor_s = raw_floor(url, settled, FLOOR_UPDATE)
            rows.append((size, overdue, settled, pass_s, floor_s, used))

        print("\nruns      overdue  settled   one pass   per run   raw UPDATE floor   index")
        for size, overdue, settled, pass_s, floor_s, used in rows:
            print(
                f"{size:>9,} {overdue:>7,} {settled:>8,} {pass_s:>9.2f}s "
                f"{pass_s / max(settled, 1) * 1000:>7.2f}ms {floor_s:>10.2f}s "
                f"({floor_s / max(settled, 1) * 1000:.2f}ms/run)   {'yes' if used else 'NO'}"
            )
        if args.json:
            print(
                json.dumps(
                    {
                        "sizes": [
                            {
                                "rows": size,
                                "overdue": overdue,
                                "settled": settled,
                                "seconds": round(pass_s, 4),
                                "ms_per_run": round(pass_s / max(settled, 1) * 1000, 3),
                                "floor_ms_per_run": round(floor_s / max(settled, 1) * 1000, 3),
                                "index_used": used,
                            }
                            for size, overdue, settled, pass_s, floor_s, used in rows
                        ]
                    }
                )
            )


if __name__ == "__main__":
    main()
