#!/usr/bin/env python
"""An approved write round beside the peer's: Leasehold against LangGraph's ``interrupt()`` /
``Command(resume=…)`` with its PostgreSQL checkpointer, alternated in one run on one database
server (docs/design.md §6.6, issue 30).

    .venv/bin/pip install -e ".[bench]"    # langgraph, its PostgreSQL checkpointer, pyinstrument
    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \
        .venv/bin/python benchmarks/peer_approval.py

It creates (and drops) a database ``leasehold_peer_<pid>`` on the server of ``DATABASE_URL``
and runs the same round in both, many times, alternating the contenders run by run so that
each sees the same machine load:

* **Leasehold**: the model (scripted) proposes one call of a no-op idempotent write; the run
  suspends for approval; a superuser approves it inline (``run_decide(mode="inline")``), the
  write runs fenced under a ``resume:`` lease and the model proposes the next call, which
  suspends again. Measured twice: the turn approved whole (``approved=True``) and the call
  approved per call (``verdicts=[CallVerdict(id, "approve")]``).
* **The peer**: a ``StateGraph`` of a model node (scripted alike) and a tool node that calls
  ``interrupt()`` with the proposed call and, resumed with ``Command(resume=True)``, runs the
  no-op write; checkpointed by ``PostgresSaver`` with ``durability="sync"``. It binds nothing
  to what runs: no digest, no lease, no fence, no preview, no authority.

A round is one decision call: from the approval to the next pause (the round whose answer ends
the run is left out, in both). The statements of a round are counted in a separate pass
(Django's ``CaptureQueriesContext``; for the peer, a psycopg cursor that counts what it
executes, and ``BEGIN``/``COMMIT`` for each transaction block).

``--json``: the last line is ``{"leasehold_ms", "peer_ms", "ratio", "leasehold_per_call_ms",
"ratio_per_call", "statements": {…}, "passes": [...]}`` (medians over every timed round; the
ratio is Leasehold's over the peer's, whole-turn approval). ``--profile`` prints the top of a
pyinstrument profile of Leasehold's rounds instead of timing them.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import postgres_server, setup_django, throwaway_postgres

WRITE_TOOL = "bench_write"


class Round(NamedTuple):
    """One round: wall seconds, and CPU seconds of this process (the client's Python: less
    sensitive to a loaded machine than the wall time, and without the server's share)."""

    wall: float
    cpu: float


# --- Leasehold ------------------------------------------------------------------------------------


class Leasehold:
    """The approved write round through Leasehold's services."""

    def __init__(self) -> None:
        from django.contrib.auth import get_user_model

        from agentruns.models import AgentConfiguration, Effect
        from agentruns.tools import Tool, registry

        def noop(context: Any, arguments: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True, "n": arguments.get("n")}

        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        registry.register(
            Tool(
                WRITE_TOOL, "Benchmark write: does nothing.", schema, Effect.IDEMPOTENT_WRITE, noop
            )
        )
        self.config = AgentConfiguration.objects.create(
            slug="bench", name="bench", provider="scripted", tools=[WRITE_TOOL], max_iterations=20
        )
        self.approver = get_user_model().objects.create_superuser("bench", "b@example.com", "x")

    def run(
        self, rounds: int, *, per_call: bool, around: Callable[[], Any] | None = None
    ) -> list[Round]:
        """One run of ``rounds`` approved writes; the time of each round but the last.
        ``around``: a context manager entered around each decision (a profiler, a counter)."""
        from agentruns.services.runs import run_decide, run_start_sync
        from agentruns.turns import CallVerdict

        script = [
            {"tool_calls": [{"name": WRITE_TOOL, "arguments": {"n": n}}]} for n in range(rounds)
        ]
        result = run_start_sync(
            configuration=self.config,
            prompt="benchmark",
            options={"script": [*script, {"content": "done"}]},
        )
        times: list[Round] = []
        while result.outcome == "awaiting_approval":
            pending = result.run.pending_turn
            decision: dict[str, Any] = (
                {"verdicts": [CallVerdict(pending["calls"][0]["id"], "approve")]}
                if per_call
                else {"approved": True}
            )
            with around() if around is not None else _nothing():
                started, cpu = time.perf_counter(), time.process_time()
                result = run_decide(
                    run_uuid=result.run.uuid,
                    actor=self.approver,
                    turn_digest=pending["turn_digest"],
                    mode="inline",
                    **decision,
                )
                elapsed = Round(time.perf_counter() - started, time.process_time() - cpu)
            if result.outcome == "awaiting_approval":
                times.append(elapsed)
        assert result.outcome == "completed", result.outcome
        return times

    def statements(self, rounds: int, *, per_call: bool) -> list[str]:
        """The statements of one round (the middle one of a run)."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        captured: list[list[str]] = []

        @contextmanager
        def capture() -> Iterator[None]:
            with CaptureQueriesContext(connection) as queries:
                yield
            captured.append([q["sql"] for q in queries.captured_queries])

        self.run(rounds, per_call=per_call, around=capture)
        return captured[len(captured) // 2]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


# --- The peer -------------------------------------------------------------------------------------


class Peer:
    """The same round through LangGraph: ``interrupt()`` in the tool node, resumed with
    ``Command(resume=True)``, checkpointed by ``PostgresSaver`` (``durability="sync"``)."""

    def __init__(self, url: str) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        self.counted = 0

        peer = self

        class CountingCursor(psycopg.Cursor):  # type: ignore[type-arg]
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                peer.counted += 1
                return super().execute(query, params, **kwargs)

            def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
                params_seq = list(params_seq)
                peer.counted += len(params_seq)
                return super().executemany(query, params_seq, **kwargs)

        # As ``PostgresSaver.from_conn_string`` connects, with a cursor that counts.
        self.conn = psycopg.Connection.connect(
            url,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            cursor_factory=CountingCursor,
        )
        transaction = self.conn.transaction

        @contextmanager
        def counted_transaction(*args: Any, **kwargs: Any) -> Iterator[Any]:
            peer.counted += 2  # BEGIN, COMMIT
            with transaction(*args, **kwargs) as tx:
                yield tx

        self.conn.transaction = counted_transaction  # type: ignore[method-assign]
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()
        self.graph = self._graph()
        self.thread = 0

    def _graph(self) -> Any:
        from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages
        from langgraph.types import interrupt

        # The functional form: evaluated now (this module's annotations are strings).
        State = TypedDict(  # noqa: UP013
            "State",
            {
                "messages": Annotated[list[AnyMessage], add_messages],
                "rounds": int,
                "done": Annotated[int, operator.add],
            },
        )

        def model(state: Any) -> dict[str, Any]:
            n = state.get("done", 0)
            if n >= state["rounds"]:
                return {"messages": [AIMessage(content="done")]}
            call = {"name": WRITE_TOOL, "args": {"n": n}, "id": f"call_{n}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}

        def tool(state: Any) -> dict[str, Any]:
            call = state["messages"][-1].tool_calls[0]
            approved = interrupt({"call": call})  # the pause; resumed with Command(resume=…)
            if approved is not True:
                content = json.dumps({"ok": False, "error": "denied"})
            else:  # the no-op write
                content = json.dumps({"ok": True, "n": call["args"].get("n")})
            return {"messages": [ToolMessage(content, tool_call_id=call["id"])], "done": 1}

        def route(state: Any) -> str:
            return "tool" if state["messages"][-1].tool_calls else END

        builder = StateGraph(State)
        builder.add_node("model", model)
        builder.add_node("tool", tool)
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", route, ["tool", END])
        builder.add_edge("tool", "model")
        return builder.compile(checkpointer=self.saver)

    def run(self, rounds: int, *, count: bool = False) -> list[Round]:
        """One thread of ``rounds`` approved writes; the time of each round but the last (with
        ``count``: the statements of each instead)."""
        from langchain_core.messages import HumanMessage
        from langgraph.types import Command

        self.thread += 1
        config = {"configurable": {"thread_id": f"bench-{os.getpid()}-{self.thread}"}}
        out = self.graph.invoke(
            {"messages": [HumanMessage("benchmark")], "rounds": rounds},
            config,
            durability="sync",
        )
        figures: list[Round] = []
        while "__interrupt__" in out:
            self.counted = 0
            started, cpu = time.perf_counter(), time.process_time()
            out = self.graph.invoke(Command(resume=True), config, durability="sync")
            elapsed = Round(time.perf_counter() - started, time.process_time() - cpu)
            if "__interrupt__" in out:
                figures.append(Round(self.counted, self.counted) if count else elapsed)
        assert out["messages"][-1].content == "done"
        return figures

    def close(self) -> None:
        self.conn.close()


# --- Report ---------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    """The range of ``values``, e.g. ``1.10–1.35``."""
    return f"{min(values):.2f}–{max(values):.2f}"


def profile(leasehold: Leasehold, rounds: int, runs: int) -> None:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0002)

    @contextmanager
    def profiled() -> Iterator[None]:
        profiler.start()
        try:
            yield
        finally:
            profiler.stop()

    for _ in range(runs):
        leasehold.run(rounds, per_call=False, around=profiled)
    print(profiler.output_text(unicode=False, color=False, show_all=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=6, help="alternated passes")
    parser.add_argument("--runs", type=int, default=4, help="runs per contender per pass")
    parser.add_argument("--rounds", type=int, default=8, help="approved writes per run")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--profile", action="store_true", help="profile Leasehold's rounds")
    args = parser.parse_args()
    rounds = max(2, min(args.rounds, 19))
    server = postgres_server("peer_approval")

    with throwaway_postgres(server, "leasehold_peer") as url:
        setup_django(
            {
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": os.environ.get(
                    "DJANGO_SETTINGS_MODULE", "config.settings.local"
                ),
                "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
            }
        )
        from django.conf import settings

        settings.DEBUG = False  # no query log while timing
        leasehold = Leasehold()
        if args.profile:
            leasehold.run(rounds, per_call=False)  # warm up
            profile(leasehold, rounds, args.runs * args.passes)
            return
        peer = Peer(url)
        try:
            report(leasehold, peer, args, rounds)
        finally:
            peer.close()


NAMES = {
    "leasehold": "Leasehold, whole-turn approval",
    "leasehold_per_call": "Leasehold, per-call approval",
    "peer": "LangGraph interrupt()/Command(resume=True), PostgresSaver, durability='sync'",
}


def report(leasehold: Leasehold, peer: Peer, args: argparse.Namespace, rounds: int) -> None:
    print(f"database server: {urlless(os.environ.get('DATABASE_URL', ''))}")
    print(
        f"{args.passes} passes x {args.runs} runs x {rounds - 1} timed rounds per contender; "
        f"load average {os.getloadavg()}, {os.cpu_count()} CPUs"
    )
    # Warm up both (caches, connections, the checkpointer's tables).
    leasehold.run(rounds, per_call=False)
    leasehold.run(rounds, per_call=True)
    peer.run(rounds)
    statements = {
        "leasehold": len(leasehold.statements(rounds, per_call=False)),
        "leasehold_per_call": len(leasehold.statements(rounds, per_call=True)),
        "peer": statistics.median(r.wall for r in peer.run(rounds, count=True)),
    }
    contenders: dict[str, Callable[[], list[Round]]] = {
        "leasehold": lambda: leasehold.run(rounds, per_call=False),
        "leasehold_per_call": lambda: leasehold.run(rounds, per_call=True),
        "peer": lambda: peer.run(rounds),
    }
    every: dict[str, list[Round]] = {name: [] for name in contenders}
    passes = []
    for index in range(args.passes):
        figures: dict[str, list[Round]] = {name: [] for name in contenders}
        names = list(contenders)
        names = names[index % len(names) :] + names[: index % len(names)]  # rotate the order
        for _ in range(args.runs):
            for name in names:
                figures[name].extend(contenders[name]())
        for name, values in figures.items():
            every[name].extend(values)
        passes.append(summary(figures))
        last = passes[-1]
        print(
            f"pass {index + 1}: ms per round (CPU ms) — Leasehold whole turn "
            f"{last['leasehold_ms']:.2f} ({last['leasehold_cpu_ms']:.2f}), per call "
            f"{last['leasehold_per_call_ms']:.2f} ({last['leasehold_per_call_cpu_ms']:.2f}), "
            f"peer {last['peer_ms']:.2f} ({last['peer_cpu_ms']:.2f}) -> ratio "
            f"{last['ratio']:.2f}x, per call {last['ratio_per_call']:.2f}x"
        )
    overall = summary(every)
    print()
    for name, label in NAMES.items():
        print(
            f"{label}: median {overall[f'{name}_ms']:.2f} ms per round (passes "
            f"{spread([p[f'{name}_ms'] for p in passes])}), CPU {overall[f'{name}_cpu_ms']:.2f} "
            f"ms (passes {spread([p[f'{name}_cpu_ms'] for p in passes])}), "
            f"{statements[name]:g} statements"
        )
    print(
        f"ratio Leasehold / peer: {overall['ratio']:.2f}x whole turn (passes "
        f"{spread([p['ratio'] for p in passes])}), {overall['ratio_per_call']:.2f}x per call "
        f"(passes {spread([p['ratio_per_call'] for p in passes])}); CPU "
        f"{overall['ratio_cpu']:.2f}x (passes {spread([p['ratio_cpu'] for p in passes])})  "
        f"(goal <= 1.0x: {'met' if overall['ratio'] <= 1.0 else 'NOT met'})"
    )
    if args.json:
        print(json.dumps({**overall, "statements": statements, "passes": passes}))


def summary(figures: dict[str, list[Round]]) -> dict[str, float]:
    """Medians in milliseconds (wall and CPU) per contender, and Leasehold's ratios to the
    peer: ``leasehold_ms``, ``peer_ms`` and ``ratio`` first."""
    ms = {
        name: statistics.median(r.wall for r in values) * 1000 for name, values in figures.items()
    }
    cpu = {
        name: statistics.median(r.cpu for r in values) * 1000 for name, values in figures.items()
    }
    return {
        "leasehold_ms": round(ms["leasehold"], 3),
        "peer_ms": round(ms["peer"], 3),
        "ratio": round(ms["leasehold"] / ms["peer"], 3),
        "leasehold_per_call_ms": round(ms["leasehold_per_call"], 3),
        "ratio_per_call": round(ms["leasehold_per_call"] / ms["peer"], 3),
        **{f"{name}_cpu_ms": round(value, 3) for name, value in cpu.items()},
        "ratio_cpu": round(cpu["leasehold"] / cpu["peer"], 3),
        "ratio_per_call_cpu": round(cpu["leasehold_per_call"] / cpu["peer"], 3),
    }


def urlless(url: str) -> str:
    """The server's host and port, without credentials."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.hostname else "(default)"


if __name__ == "__main__":
    main()
