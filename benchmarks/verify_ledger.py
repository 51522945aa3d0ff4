#!/usr/bin/env python
"""How fast ``verify_ledger`` checks the ledger, and that its memory stays flat (issue 13 §2).

Fills a THROWAWAY database (PostgreSQL with a PostgreSQL ``DATABASE_URL``, else a temporary
SQLite file) with chained runs — ``--runs`` runs of ``--events`` events each, payloads shaped like
the runtime's — then times ``agentruns.audit.verify`` over a tenth of them and over all of them,
with the peak of Python memory (tracemalloc) for each, beside a baseline measured in the same run:
reading the same rows without verifying anything.

    .venv/bin/python benchmarks/verify_ledger.py
    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/verify_ledger.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import is_postgres, setup_django, throwaway_postgres


@contextmanager
def throwaway_database() -> Iterator[str]:
    configured = os.environ.get("DATABASE_URL", "")
    if is_postgres(configured):
        with throwaway_postgres(configured, "leasehold_ledger_bench") as url:
            yield url
        return
    directory = tempfile.mkdtemp(prefix="leasehold-ledger-bench-")
    try:
        yield f"sqlite:///{os.path.join(directory, 'bench.sqlite3')}"
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def payload(n: int) -> dict:
    if n % 3 == 0:
        return {"iteration": n, "final": False, "system": "", "message_count": n, "tools": ["t"]}
    if n % 3 == 1:
        return {
            "iteration": n,
            "content": "thinking " * 10,
            "tool_calls": [{"id": f"call_{n}", "name": "list_notes", "arguments": {}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30},
            "model": "scripted",
        }
    return {
        "call_id": f"call_{n - 1}",
        "name": "list_notes",
        "arguments": {},
        "effect": "read",
        "outcome": "executed",
        "ok": True,
        "result": {"notes": [{"id": 1, "title": "t"}], "truncated": False},
        "content": '{"notes": [{"id": 1, "title": "t"}], "truncated": false}',
    }


def fill(runs: int, events: int) -> None:
    from django.db import transaction
    from django.utils import timezone

    from agentruns import ledger
    from agentruns.leases import EventSpec
    from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent

    configuration = AgentConfiguration.objects.create(slug="bench", name="bench")
    specs = [EventSpec("llm", payload(n)) for n in range(events)]
    moment = timezone.now()  # every event's created_at (auto_now_add sets its own: reset below)
    for start in range(0, runs, 50):
        with transaction.atomic():
            batch = []
            rows = []
            for _ in range(min(50, runs - start)):
                run_uuid = uuid.uuid4()
                links, head = ledger.chain(
                    run_uuid=run_uuid,
                    prev_hash=ledger.genesis(run_uuid),
                    first_sequence=0,
                    segment="worker:bench:1",
                    lease_epoch=1,
                    events=specs,
                    created_at=moment,
                )
                batch.append(
                    AgentRun(
                        uuid=run_uuid,
                        configuration=configuration,
                        prompt="p",
                        status="completed",
                        ledger_head=head,
                    )
                )
                rows.append(links)
            created = AgentRun.objects.bulk_create(batch)
            AgentRunEvent.objects.bulk_create(
                [
                    AgentRunEvent(
                        run=run,
                        sequence=n,
                        kind="llm",
                        segment="worker:bench:1",
                        lease_epoch=1,
                        payload=specs[n].payload,
                        prev_hash=link.prev_hash,
                        hash=link.hash,
                        ledger_key=link.key_id,
                    )
                    for run, links in zip(created, rows, strict=True)
                    for n, link in enumerate(links)
                ],
                batch_size=2000,
            )
            AgentRunEvent.objects.filter(run__in=created).update(created_at=moment)


def measure(label: str, action) -> tuple[float, float, object]:
    """Wall time of ``action`` (untraced), then its peak Python memory in a second, traced pass
    (tracemalloc slows every allocation, so it never runs while timing)."""
    started = time.perf_counter()
    result = action()
    elapsed = time.perf_counter() - started
    tracemalloc.start()
    action()
    peak = tracemalloc.get_traced_memory()[1] / 1024 / 1024
    tracemalloc.stop()
    return elapsed, peak, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100, help="events per run")
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

        settings.DEBUG = False
        from agentruns import audit
        from agentruns.models import AgentRun, AgentRunEvent

        started = time.perf_counter()
        fill(args.runs, args.events)
        total = AgentRunEvent.objects.count()
        print(f"database: {url.split('@')[-1]}")
        print(
            f"filled {args.runs} runs x {args.events} events = {total} in "
            f"{time.perf_counter() - started:.1f} s; load average {os.getloadavg()}"
        )

        def read_only_rows() -> int:
            n = 0
            for _ in (
                AgentRunEvent.objects.order_by("run_id", "sequence")
                .values_list("run_id", "sequence", "kind", "payload", "prev_hash", "hash")
                .iterator(chunk_size=2000)
            ):
                n += 1
            return n

        tenth = AgentRun.objects.order_by("pk").values_list("updated_at", flat=True)[
            args.runs - args.runs // 10
        ]
        small_s, small_mb, small = measure("tenth", lambda: audit.verify(since=tenth))
        read_s, read_mb, _ = measure("read", read_only_rows)
        all_s, all_mb, report = measure("all", audit.verify)
        assert report.intact and report.events == total, report.summary()
        print(f"verify a tenth: {small.summary()} in {small_s:.2f} s, peak {small_mb:.1f} MiB")
        print(
            f"verify all:     {report.summary()} in {all_s:.2f} s "
            f"({total / all_s:,.0f} events/s), peak {all_mb:.1f} MiB"
        )
        print(
            f"baseline: reading the same rows without verifying: {read_s:.2f} s, "
            f"peak {read_mb:.1f} MiB -> verifying costs {all_s / read_s:.1f}x the read"
        )
        print(f"memory: ten times the events, {all_mb / small_mb:.1f}x the peak (flat: ~1x)")


if __name__ == "__main__":
    main()
