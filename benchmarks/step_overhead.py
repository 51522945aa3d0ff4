#!/usr/bin/env python
"""Step overhead of the agent runtime: SQL statements and wall time per round (docs/design.md §6.6).

Runs many scripted runs against a THROWAWAY database of the configured kind and prints, per
round, the statements the runtime issued and its wall time, beside a baseline measured in the
same run: the same number of raw single-row guarded ``UPDATE``s and ``INSERT``s, each its own
transaction, through psycopg (PostgreSQL) or sqlite3 (SQLite).

    DJANGO_SETTINGS_MODULE=config.settings.local .venv/bin/python benchmarks/step_overhead.py
    DATABASE_URL=postgres://root@127.0.0.1:5432/test .venv/bin/python benchmarks/step_overhead.py

With a PostgreSQL ``DATABASE_URL`` it creates (and drops) a database ``leasehold_bench_<pid>``
on that server; otherwise it migrates a temporary SQLite file. The developer's database is never
touched. Workloads:

* ``read``: every round is a provider call answered with one call of a no-op read tool;
* ``write``: every round is a provider call answered with one call of a no-op idempotent write,
  which suspends, is approved inline and runs fenced under a ``resume:`` segment;
* ``pair``: every round proposes two such writes, approved whole (one decision for the turn);
* ``per_call``: the same two-call turn decided per call — the first approved, the second denied
  with a reason (docs/design.md §5): the denial is settled at a boundary before the write runs.

Tool bodies and the scripted provider issue no SQL, so every statement counted is the runtime's.
A round runs from one ``request`` event to the next; the closing provider call is not a round.

``--priced`` prices the configuration (each answer is charged to the spend ledger) and
``--budget`` also gives it a daily budget it never reaches (the check before each provider
call), docs/design.md §14. ``--otel`` sets an OpenTelemetry SDK tracer provider first (every
span made and batched, then dropped: README "Tracing with OpenTelemetry"); compare it with a
run without. ``--workloads read`` runs only the ones named.

With ``--json`` the last line is one JSON object: ``{"database": "postgresql"|"sqlite", "read":
{"statements_per_round", "ms_per_round", "raw_replay_ms", "ratio_to_raw_replay"}, "write",
"pair", "per_call": {…the same keys}}`` (medians; the raw replay is the round's own statements
through the driver).

The ledger's cost (issue 13: at most 5 % of a round): the time spent computing the hash chain
(``agentruns.ledger.chain``) inside the timed rounds, against the rounds' time (the hashing of a
run's birth and settle happens outside its rounds: it is reported apart, as a share of the whole
run); and the same rounds timed again with the chain replaced by placeholder links (the same
columns and bytes written, nothing hashed), alternated run by run so that each pair sees the same
machine load, the difference taken per pair.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import is_postgres, setup_django, throwaway_postgres

READ_TOOL = "bench_read"
WRITE_TOOL = "bench_write"


# --- The throwaway database ----------------------------------------------------------------------


@dataclass
class Target:
    vendor: str  # "postgresql" | "sqlite"
    url: str
    label: str
    sqlite_path: str = ""


@contextmanager
def throwaway_database() -> Iterator[Target]:
    configured = os.environ.get("DATABASE_URL", "")
    if is_postgres(configured):
        with throwaway_postgres(configured, "leasehold_bench") as url:
            parts = urlsplit(url)
            label = f"PostgreSQL {parts.hostname}:{parts.port} db {parts.path.lstrip('/')}"
            yield Target("postgresql", url, label)
        return
    directory = tempfile.mkdtemp(prefix="leasehold-bench-")
    path = os.path.join(directory, "bench.sqlite3")
    try:
        yield Target("sqlite", f"sqlite:///{path}", f"SQLite file {path}", sqlite_path=path)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def setup_django_on(target: Target) -> None:
    from django.conf import settings

    setup_django(
        {
            "DATABASE_URL": target.url,
            "DJANGO_SETTINGS_MODULE": os.environ.get(
                "DJANGO_SETTINGS_MODULE", "config.settings.local"
            ),
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
        }
    )
    settings.DEBUG = False  # no query log while timing; CaptureQueriesContext turns it on


# --- The runtime workloads -----------------------------------------------------------------------


def register_tools() -> None:
    from agentruns.models import Effect
    from agentruns.tools import Tool, registry

    def noop(context: Any, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "n": arguments.get("n")}

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    registry.register(Tool(READ_TOOL, "Benchmark read: does nothing.", schema, Effect.READ, noop))
    registry.register(
        Tool(WRITE_TOOL, "Benchmark write: does nothing.", schema, Effect.IDEMPOTENT_WRITE, noop)
    )


#: The workloads, in the order they run; ``pair`` and ``per_call`` propose two calls a turn.
WORKLOADS = ("read", "write", "pair", "per_call")


def script(tool: str, rounds: int, *, calls: int = 1) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": tool, "arguments": {"n": n * 10 + i}} for i in range(calls)]}
        for n in range(rounds)
    ]
    return [*turns, {"content": "done"}]


def decision(workload: str, run: Any) -> dict[str, Any]:
    """The decision a workload gives a waiting run: the whole turn approved, or (``per_call``)
    its first call approved and its second denied with a reason."""
    if workload != "per_call":
        return {"approved": True}
    from agentruns.turns import CallVerdict

    first, second = (call["id"] for call in run.pending_turn["calls"])
    return {
        "verdicts": [
            CallVerdict(first, "approve"),
            CallVerdict(second, "deny", reason="benchmark: not this one"),
        ]
    }


class RoundClock:
    """Observer: marks where each round starts (a committed ``request`` event)."""

    def __init__(self, count_statements: Any = None) -> None:
        self.marks: list[tuple[float, int]] = []
        self.count_statements = count_statements

    def __call__(self, spec: Any) -> None:
        if spec.kind == "request":
            count = self.count_statements() if self.count_statements else 0
            self.marks.append((time.perf_counter(), count))


def one_run(workload: str, rounds: int, clock: RoundClock, approver: Any, config: Any) -> str:
    from agentruns.services.runs import run_decide, run_start_sync

    tool = READ_TOOL if workload == "read" else WRITE_TOOL
    calls = 2 if workload in ("pair", "per_call") else 1
    result = run_start_sync(
        configuration=config,
        prompt="benchmark",
        options={"script": script(tool, rounds, calls=calls)},
        observer=clock,
    )
    while result.outcome == "awaiting_approval":
        result = run_decide(
            run_uuid=result.run.uuid,
            actor=approver,
            turn_digest=result.run.pending_turn["turn_digest"],
            mode="inline",
            observer=clock,
            **decision(workload, result.run),
        )
    return result.outcome


class LedgerCost:
    """Times ``ledger.chain`` (the hashing of a round's events) and can switch the hashing off
    for an A/B comparison: placeholder links of the same length, so the writes are the same."""

    def __init__(self) -> None:
        from agentruns import ledger

        self.ledger = ledger
        self.real = ledger.chain
        self.calls: list[tuple[float, float]] = []  # (started, seconds) of every chain() call

    def _timed(self, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.real(**kwargs)
        finally:
            self.calls.append((started, time.perf_counter() - started))

    def within(self, start: float, end: float) -> float:
        """Seconds spent hashing in the calls that started in [start, end)."""
        return sum(seconds for started, seconds in self.calls if start <= started < end)

    def _unhashed(self, *, events: Any, **kwargs: Any) -> Any:
        from django.utils import timezone

        filler, now = "0" * 64, timezone.now()
        return [self.ledger.Link(filler, filler, now, "") for _ in events], filler

    @contextmanager
    def hashing(self, on: bool) -> Iterator[None]:
        self.ledger.chain = self._timed if on else self._unhashed  # type: ignore[assignment]
        try:
            yield
        finally:
            self.ledger.chain = self.real  # type: ignore[assignment]


@dataclass
class RoundStats:
    times_ms: list[float] = field(default_factory=list)
    statements: list[Counter] = field(default_factory=list)
    sql_lengths: dict[str, list[int]] = field(default_factory=lambda: {"UPDATE": [], "INSERT": []})
    example: list[str] = field(default_factory=list)
    raw_ms: list[float] = field(default_factory=list)
    replay_ms: list[float] = field(default_factory=list)
    chain_ms: list[float] = field(default_factory=list)  # hashing inside the rounds, per round
    run_share: list[float] = field(default_factory=list)  # a whole run's hashing, % of the run
    unhashed_ms: list[float] = field(default_factory=list)  # rounds with the hashing off
    added: list[float] = field(default_factory=list)  # per pair of runs: % the hashing added


def kind_of(sql: str) -> str:
    word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    return {"RELEASE": "SAVEPOINT", "ROLLBACK": "COMMIT"}.get(word, word)


def count_statements(workload: str, *, runs: int, rounds: int, config: Any, approver: Any):
    """Pass 1: the statements of each round (the capture wrapper is on, so no timing here)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    stats = RoundStats()
    for index in range(runs):
        with CaptureQueriesContext(connection) as captured:
            clock = RoundClock(lambda: len(captured.captured_queries))
            outcome = one_run(workload, rounds, clock, approver, config)
        assert outcome == "completed", outcome
        queries = [q["sql"] for q in captured.captured_queries]
        counts = [count for _, count in clock.marks]
        for start, end in itertools.pairwise(counts):
            chunk = queries[start:end]
            stats.statements.append(Counter(kind_of(sql) for sql in chunk))
            for sql in chunk:
                if kind_of(sql) in stats.sql_lengths:
                    stats.sql_lengths[kind_of(sql)].append(len(sql))
                elif kind_of(sql) == "WITH" and " INSERT INTO " in sql:  # UPDATE + INSERT
                    update, insert = sql.split(" INSERT INTO ", 1)
                    stats.sql_lengths["UPDATE"].append(len(update))
                    stats.sql_lengths["INSERT"].append(len(insert))
            if index == 0 and start == counts[len(counts) // 2]:
                stats.example = chunk
    return stats


def time_rounds(
    workload: str,
    stats: RoundStats,
    baseline: RawBaseline,
    *,
    runs: int,
    rounds: int,
    config: Any,
    approver: Any,
) -> None:
    """Pass 2: wall time per round, no query log; after each run, the raw baseline for the same
    number of rounds, so that both see the same machine load."""
    counts = median_counter(stats.statements)
    updates, inserts = int(counts.get("UPDATE", 0)), int(counts.get("INSERT", 0))
    updates, inserts = updates + int(counts.get("WITH", 0)), inserts + int(counts.get("WITH", 0))
    state = padded_json(int(statistics.median(stats.sql_lengths["UPDATE"] or [400])) // 2)
    payload = padded_json(int(statistics.median(stats.sql_lengths["INSERT"] or [400])) // 2)
    kinds = [kind_of(sql) for sql in stats.example]
    cost = LedgerCost()
    for index in range(runs):
        # Each pair runs hashed then unhashed, or the other way round (every other pair), so
        # that neither always follows the raw baseline's statements.
        if index % 2:
            plain = _unhashed_rounds(cost, workload, rounds, approver, config, stats)
        clock = RoundClock()
        cost.calls = []
        started = time.perf_counter()
        with cost.hashing(True):
            outcome = one_run(workload, rounds, clock, approver, config)
        run_seconds = time.perf_counter() - started
        assert outcome == "completed", outcome
        times = [t for t, _ in clock.marks]
        hashed = [(b - a) * 1000 for a, b in itertools.pairwise(times)]
        stats.times_ms.extend(hashed)
        # The hashing inside the timed rounds, per round; and the whole run's (its birth and
        # its settle included) as a share of the whole run's time.
        stats.chain_ms.append(cost.within(times[0], times[-1]) * 1000 / max(1, len(times) - 1))
        stats.run_share.append(cost.within(started, float("inf")) / run_seconds * 100)
        if not index % 2:
            plain = _unhashed_rounds(cost, workload, rounds, approver, config, stats)
        # Paired: this run's rounds against its neighbour's (same load), hashed vs not.
        stats.added.append(
            (statistics.median(hashed) - statistics.median(plain)) / statistics.median(plain) * 100
        )
        for _ in range(len(times) - 1):
            stats.raw_ms.append(
                baseline.round_ms(updates=updates, inserts=inserts, state=state, payload=payload)
            )
            stats.replay_ms.append(baseline.replay_ms(kinds=kinds, state=state, payload=payload))


def _unhashed_rounds(
    cost: LedgerCost, workload: str, rounds: int, approver: Any, config: Any, stats: RoundStats
) -> list[float]:
    """One run with the hashing off; its rounds' times (ms)."""
    unhashed = RoundClock()
    with cost.hashing(False):
        assert one_run(workload, rounds, unhashed, approver, config) == "completed"
    marks = [t for t, _ in unhashed.marks]
    plain = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    stats.unhashed_ms.extend(plain)
    return plain


# --- The raw baseline ----------------------------------------------------------------------------


class RawBaseline:
    """Single-row guarded UPDATEs and INSERTs, each its own transaction, on a raw connection."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.pg = target.vendor == "postgresql"
        if self.pg:
            import psycopg

            self.conn = psycopg.connect(target.url, autocommit=True)
            self.conn.execute(
                "CREATE TABLE bench_run (id bigserial PRIMARY KEY, status varchar(32),"
                " claimed_by varchar(255), lease_epoch integer, lease_expires timestamptz,"
                " loop_state jsonb, updated_at timestamptz)"
            )
            self.conn.execute(
                "CREATE TABLE bench_event (id bigserial PRIMARY KEY, run_id bigint,"
                " sequence integer, kind varchar(20), payload jsonb, created_at timestamptz,"
                " UNIQUE (run_id, sequence))"
            )
            self.update_sql = (
                "UPDATE bench_run SET lease_expires = statement_timestamp() + interval '60 s',"
                " loop_state = %s::jsonb, updated_at = statement_timestamp()"
                " WHERE id = %s AND status = 'running' AND claimed_by = %s AND lease_epoch = %s"
            )
            self.insert_sql = (
                "INSERT INTO bench_event (run_id, sequence, kind, payload, created_at)"
                " VALUES (%s, %s, 'tool', %s::jsonb, statement_timestamp())"
            )
            # A boundary as one statement (the runtime's data-modifying CTE on PostgreSQL).
            self.boundary_sql = (
                "WITH u AS (UPDATE bench_run SET lease_expires = statement_timestamp()"
                " + interval '60 s', loop_state = %s::jsonb, updated_at = statement_timestamp()"
                " WHERE id = %s AND status = 'running' AND claimed_by = %s AND lease_epoch = %s"
                " RETURNING 1) INSERT INTO bench_event (run_id, sequence, kind, payload,"
                " created_at) SELECT %s, %s, 'tool', %s::jsonb, statement_timestamp() FROM u"
            )
            self.conn.execute(
                "INSERT INTO bench_run (status, claimed_by, lease_epoch, loop_state)"
                " VALUES ('running', 'worker:h:1', 1, '{}')"
            )
        else:
            self.conn = sqlite3.connect(target.sqlite_path, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(
                "CREATE TABLE bench_run (id integer PRIMARY KEY, status text, claimed_by text,"
                " lease_epoch integer, lease_expires text, loop_state text, updated_at text)"
            )
            self.conn.execute(
                "CREATE TABLE bench_event (id integer PRIMARY KEY, run_id integer,"
                " sequence integer, kind text, payload text, created_at text,"
                " UNIQUE (run_id, sequence))"
            )
            self.update_sql = (
                "UPDATE bench_run SET lease_expires = datetime('now', '+60 seconds'),"
                " loop_state = ?, updated_at = datetime('now')"
                " WHERE id = ? AND status = 'running' AND claimed_by = ? AND lease_epoch = ?"
            )
            self.insert_sql = (
                "INSERT INTO bench_event (run_id, sequence, kind, payload, created_at)"
                " VALUES (?, ?, 'tool', ?, datetime('now'))"
            )
            self.conn.execute(
                "INSERT INTO bench_run (status, claimed_by, lease_epoch, loop_state)"
                " VALUES ('running', 'worker:h:1', 1, '{}')"
            )
        self.sequence = 0

    def round_ms(self, *, updates: int, inserts: int, state: str, payload: str) -> float:
        started = time.perf_counter()
        for _ in range(updates):
            cursor = self.conn.execute(self.update_sql, (state, 1, "worker:h:1", 1))
            assert cursor.rowcount == 1
        for _ in range(inserts):
            self.conn.execute(self.insert_sql, (1, self.sequence, payload))
            self.sequence += 1
        return (time.perf_counter() - started) * 1000

    def replay_ms(self, *, kinds: list[str], state: str, payload: str) -> float:
        """The runtime's own statement sequence of a round, raw: the same transactions, the
        same single-row guarded UPDATEs, INSERTs and single-row SELECTs."""
        select = "SELECT * FROM bench_run WHERE id = " + ("%s" if self.pg else "?")
        started = time.perf_counter()
        for kind in kinds:
            if kind == "BEGIN":
                self.conn.execute("BEGIN" if self.pg else "BEGIN IMMEDIATE")
            elif kind == "COMMIT":
                self.conn.execute("COMMIT")
            elif kind == "UPDATE":
                assert self.conn.execute(self.update_sql, (state, 1, "worker:h:1", 1)).rowcount
            elif kind == "INSERT":
                self.conn.execute(self.insert_sql, (1, self.sequence, payload))
                self.sequence += 1
            elif kind == "SELECT":
                self.conn.execute(select, (1,)).fetchall()
            elif kind == "WITH":
                params = (state, 1, "worker:h:1", 1, 1, self.sequence, payload)
                assert self.conn.execute(self.boundary_sql, params).rowcount
                self.sequence += 1
        return (time.perf_counter() - started) * 1000

    def close(self) -> None:
        self.conn.close()


def padded_json(length: int) -> str:
    """A JSON object whose text is about ``length`` characters (like the runtime's payloads)."""
    return json.dumps({"pad": "x" * max(0, length - 12)})


# --- Report --------------------------------------------------------------------------------------


def median_counter(counters: list[Counter]) -> Counter:
    keys = sorted({key for counter in counters for key in counter})
    return Counter({key: statistics.median(c.get(key, 0) for c in counters) for key in keys})


def report(workload: str, stats: RoundStats) -> dict[str, Any]:
    counts = median_counter(stats.statements)
    updates, inserts = int(counts.get("UPDATE", 0)), int(counts.get("INSERT", 0))
    updates, inserts = updates + int(counts.get("WITH", 0)), inserts + int(counts.get("WITH", 0))
    raw = stats.raw_ms
    runtime_ms = statistics.median(stats.times_ms)
    raw_ms = statistics.median(raw)
    total = sum(counts.values())
    print(f"\n== {workload} rounds ({len(stats.times_ms)} timed, {len(stats.statements)} counted)")
    print(
        "  statements per round (median): "
        + ", ".join(f"{key} {value:g}" for key, value in sorted(counts.items()))
        + f"  = {total:g}"
    )
    print(
        f"  runtime per round: median {runtime_ms:.2f} ms, "
        f"p90 {statistics.quantiles(stats.times_ms, n=10)[-1]:.2f} ms"
    )
    print(
        f"  raw baseline ({updates} guarded UPDATE + {inserts} INSERT, autocommit each): "
        f"median {raw_ms:.2f} ms, p90 {statistics.quantiles(raw, n=10)[-1]:.2f} ms"
    )
    ratio = runtime_ms / raw_ms if raw_ms else float("inf")
    print(
        f"  ratio runtime / raw: {ratio:.2f}x  (goal <= 2x: {'met' if ratio <= 2 else 'NOT met'})"
    )
    replay_ms = statistics.median(stats.replay_ms)
    replay_ratio = runtime_ms / replay_ms if replay_ms else float("inf")
    print(
        f"  raw replay of the round's own {len(stats.example)} statements (same transactions): "
        f"median {replay_ms:.2f} ms -> runtime / replay {replay_ratio:.2f}x"
    )
    lease_updates = sum(
        1
        for sql in stats.example
        if kind_of(sql) in ("UPDATE", "WITH") and '"lease_epoch" = ' in sql.split(" WHERE ")[1]
    )
    print(
        f"  lease/fence accounting: {lease_updates} owner-guarded UPDATE(s) of the run row "
        f"(boundaries, suspend, fence stamp) beside {inserts} event INSERT(s) in the example round"
    )
    chain_ms = statistics.median(stats.chain_ms)
    unhashed_ms = statistics.median(stats.unhashed_ms)
    share = chain_ms / runtime_ms * 100 if runtime_ms else 0.0
    added = statistics.median(stats.added)
    quartiles = statistics.quantiles(stats.added, n=4) if len(stats.added) > 1 else [added] * 3
    print(
        f"  ledger: hashing inside the rounds {chain_ms:.3f} ms per round = {share:.1f} % of the "
        f"round (a whole run's, birth and settle included: "
        f"{statistics.median(stats.run_share):.1f} % of the run)"
    )
    print(
        f"  ledger A/B: rounds without hashing (runs alternated): median {unhashed_ms:.2f} ms; "
        f"hashing adds {added:+.1f} % (median of {len(stats.added)} run pairs, quartiles "
        f"{quartiles[0]:+.1f} / {quartiles[2]:+.1f})  (goal <= 5 %: "
        f"{'met' if max(share, added) <= 5 else 'NOT met'})"
    )
    print("  one round's statements, in order:")
    for sql in stats.example:
        print(f"    {shorten(sql)}")
    return {
        "statements_per_round": total,
        "ms_per_round": round(runtime_ms, 3),
        "raw_replay_ms": round(replay_ms, 3),
        "ratio_to_raw_replay": round(replay_ratio, 3),
    }


def shorten(sql: str) -> str:
    sql = " ".join(sql.split())
    head = sql.split(" SET ", 1)[0] if sql.upper().startswith("UPDATE") else sql
    if sql.upper().startswith("UPDATE") and " WHERE " in sql:
        head += " SET … WHERE " + sql.rsplit(" WHERE ", 1)[1]
    return head if len(head) <= 150 else head[:147] + "..."


def install_tracer_provider() -> None:
    """An SDK tracer provider batching every span to an exporter that drops it: the cost of
    making, recording and queueing the spans, not of a network."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per workload")
    parser.add_argument("--rounds", type=int, default=8, help="tool rounds per run (max 19)")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument(
        "--priced",
        action="store_true",
        help="price the configuration: each answer is also charged to the spend ledger",
    )
    parser.add_argument(
        "--budget",
        action="store_true",
        help="with --priced, a daily budget it never reaches: the check before each call",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="an OpenTelemetry SDK tracer provider is set: every span is made and batched "
        "(to an exporter that drops it), as in a traced deployment (agentruns/tracing.py)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)}",
    )
    args = parser.parse_args()
    rounds = max(2, min(args.rounds, 19))
    workloads = [w for w in args.workloads.split(",") if w in WORKLOADS]
    if args.otel:
        install_tracer_provider()

    with throwaway_database() as target:
        setup_django_on(target)
        register_tools()
        from django.contrib.auth import get_user_model

        from agentruns.models import AgentConfiguration

        config = AgentConfiguration.objects.create(
            slug="bench",
            name="bench",
            provider="scripted",
            tools=[READ_TOOL, WRITE_TOOL],
            max_iterations=20,
            # Cost (docs/design.md §14): priced answers are charged, a budget is checked.
            **(
                {
                    "price_per_million_prompt_tokens": "2.50",
                    "price_per_million_completion_tokens": "10.00",
                }
                if args.priced or args.budget
                else {}
            ),
            # A bound per call (docs/design.md §14): each call holds 128k tokens' worth.
            **({"daily_budget": "99999999", "max_tokens_per_call": 128_000} if args.budget else {}),
        )
        approver = get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
        print(f"database: {target.label}")
        print(f"{args.runs} runs x {rounds} rounds per workload; no-op tools, scripted provider")
        print(f"machine load average (1/5/15 min): {os.getloadavg()}, {os.cpu_count()} CPUs")
        baseline = RawBaseline(target)
        results: dict[str, Any] = {
            "database": target.vendor,
            "priced": args.priced or args.budget,
            "budget": args.budget,
            "otel": args.otel,
        }
        try:
            # Warm up caches and connections.
            one_run("read", 2, RoundClock(), approver, config)
            one_run("write", 2, RoundClock(), approver, config)
            one_run("per_call", 2, RoundClock(), approver, config)
            for workload in workloads:
                stats = count_statements(
                    workload,
                    runs=max(1, args.runs // 4),
                    rounds=rounds,
                    config=config,
                    approver=approver,
                )
                time_rounds(
                    workload,
                    stats,
                    baseline,
                    runs=args.runs,
                    rounds=rounds,
                    config=config,
                    approver=approver,
                )
                results[workload] = report(workload, stats)
        finally:
            baseline.close()
        if args.json:
            print(json.dumps(results))


if __name__ == "__main__":
    main()
