#!/usr/bin/env python
"""The dashboard at scale (issue 14 §6): drawing every chart over a history of 10,000 and
100,000 runs whose windows hold the same rows, so only what lies outside the windows grows.

    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres .venv/bin/python \\
        benchmarks/dashboard_render.py --sizes 10000,100000 --json

Each size is filled into a THROWAWAY database ``leasehold_dashboard_<pid>`` on the server of
``DATABASE_URL`` (dropped afterwards; nothing else is touched): ``--in-window`` runs ended in the
last day with an ``llm`` and an ``approval`` event each (and a ``reaper`` event for one in ten),
and the rest of the runs the same but 30–400 days old, plus 60 runs waiting now. Then the page's
charts are drawn ``--repeat`` times (``charts.draw_all``): the median wall time, the time the
four queries took (the database's share), the pygal drawing (the rest), the number of queries,
and each query's plan (whether it reaches its window through an index). The baseline, measured
in the same run on the same database: one raw ``count(*)`` of the runs ended in the last day,
through the ``(status, finished_at)`` index.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import (
    postgres_server,
    production_environment,
    setup_django,
    throwaway_postgres,
)

CHUNK = 5000


def fill(start: int, stop: int, in_window: int) -> None:
    """Runs number ``start`` to ``stop`` (the first ``in_window`` end in the last day, the rest
    30-400 days ago), with their events; the waiting runs with the first fill."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, EventKind, Status

    # The benchmark writes history: events at chosen times, not "now".
    AgentRunEvent._meta.get_field("created_at").auto_now_add = False  # type: ignore[attr-defined]
    configuration, _ = AgentConfiguration.objects.get_or_create(slug="bench", name="bench")
    now = timezone.now()
    statuses = (Status.COMPLETED, Status.COMPLETED, Status.FAILED, Status.CANCELLED)
    for first in range(start, stop, CHUNK):
        with transaction.atomic():
            runs, ends = [], []
            for i in range(first, min(first + CHUNK, stop)):
                if i < in_window:
                    ended = now - timedelta(minutes=(i * 1439) // max(in_window, 1))
                else:
                    ended = now - timedelta(days=30 + i % 370, minutes=i % 1440)
                ends.append(ended)
                runs.append(
                    AgentRun(
                        configuration=configuration,
                        prompt="p",
                        status=statuses[i % 4],
                        finished_at=ended,
                    )
                )
            made = AgentRun.objects.bulk_create(runs)
            events = []
            for n, (run, ended) in enumerate(zip(made, ends, strict=True)):
                asked = ended - timedelta(minutes=5 + n % 50)
                events.append(
                    AgentRunEvent(run=run, sequence=0, kind=EventKind.LLM, created_at=asked)
                )
                events.append(
                    AgentRunEvent(
                        run=run,
                        sequence=1,
                        kind=EventKind.APPROVAL,
                        created_at=ended - timedelta(minutes=1),
                        payload={"approved": True},
                    )
                )
                if n % 10 == 0:
                    events.append(
                        AgentRunEvent(
                            run=run,
                            sequence=2,
                            kind=EventKind.REAPER,
                            created_at=ended,
                            payload={"rule": "reclaim", "verdict": "requeued"},
                        )
                    )
            AgentRunEvent.objects.bulk_create(events)
    if start == 0:
        waiting = (Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT)
        AgentRun.objects.bulk_create(
            AgentRun(configuration=configuration, prompt="p", status=waiting[i % 2])
            for i in range(60)
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def measure(repeat: int) -> dict:
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from agentruns.dashboard import charts
    from agentruns.models import AgentRun, Status

    walls, query_times, counts = [], [], []
    plans: list[str] = []
    for n in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            charts.draw_all()
            walls.append(time.perf_counter() - started)
        counts.append(len(captured))
        query_times.append(sum(float(q["time"]) for q in captured.captured_queries))
        if n == 0:
            with connection.cursor() as cursor:
                for query in captured.captured_queries:
                    cursor.execute("EXPLAIN " + query["sql"])
                    plans.append("\n".join(row[0] for row in cursor.fetchall()))
    baseline = []
    since = timezone.now() - timedelta(days=1)
    for _ in range(repeat):
        started = time.perf_counter()
        AgentRun.objects.filter(status=Status.COMPLETED, finished_at__gte=since).count()
        baseline.append(time.perf_counter() - started)
    return {
        "render_ms": round(statistics.median(walls) * 1000, 1),
        "queries_ms": round(statistics.median(query_times) * 1000, 1),
        "drawing_ms": round(
            statistics.median(walls) * 1000 - statistics.median(query_times) * 1000, 1
        ),
        "queries": sorted(set(counts)),
        "baseline_count_ms": round(statistics.median(baseline) * 1000, 2),
        "plans_use_an_index": ["Index" in plan or "Bitmap" in plan for plan in plans],
        "plans": plans,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--in-window", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = postgres_server("dashboard_render.py")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    in_window = min(args.in_window, sizes[0])
    results = {}
    with throwaway_postgres(server, "leasehold_dashboard") as url:
        setup_django(production_environment(url))
        filled_to = 0
        for size in sizes:
            # The same runs in the windows at every size: only the older history grows.
            started = time.perf_counter()
            fill(filled_to, size, in_window)
            filled_to = size
            result = {"fill_s": round(time.perf_counter() - started, 1), **measure(args.repeat)}
            results[size] = result
            print(
                f"{size:>8} runs ({in_window} in the windows): render {result['render_ms']} ms "
                f"(queries {result['queries_ms']} ms, drawing {result['drawing_ms']} ms), "
                f"{result['queries']} queries, indexes used {result['plans_use_an_index']}; "
                f"baseline count(*) {result['baseline_count_ms']} ms"
            )
            if not args.json:
                for plan in result["plans"]:
                    print("    " + plan.replace("\n", "\n    "))
    if args.json:
        print(
            json.dumps(
                {str(k): {x: y for x, y in v.items() if x != "plans"} for k, v in results.items()}
            )
        )


if __name__ == "__main__":
    main()
