#!/usr/bin/env python
"""What Leasehold's guarantees cost a LangGraph tool call (docs/external.md): the same graph, the
same scripted model and the same tool, run by LangGraph alone (``langgraph.prebuilt.ToolNode``)
and under a Leasehold run (``agentruns.external.langgraph.ToolNode``), alternated run by run in
the same process so both see the same machine load. Prints, per round (one model answer
proposing one tool call, and that call), the median wall time of each, the ratio, and the SQL
statements Leasehold issued.

    .venv/bin/python benchmarks/external_overhead.py
    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \
        .venv/bin/python benchmarks/external_overhead.py

With a PostgreSQL ``DATABASE_URL`` it creates (and drops) ``leasehold_bench_external_<pid>`` on
that server; otherwise it migrates a temporary SQLite file. Workloads: ``read`` (a read: the
call runs under the lease, its event written at a boundary) and ``write`` (an idempotent write
that needs no approval, ``requires_approval=False``: the fence stamped and cleared around it).
Both graphs checkpoint in memory with ``durability="sync"``. ``--json``: the last line is one
JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from langchain_core.language_models.fake_chat_models import (  # noqa: E402
    FakeMessagesListChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from benchmarks._support import is_postgres, throwaway_postgres  # noqa: E402


def _environment(url: str) -> None:
    os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="config.settings.local")
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


@contextmanager
def database() -> Iterator[str]:
    url = os.environ.get("DATABASE_URL", "")
    if is_postgres(url):
        with throwaway_postgres(url, "leasehold_bench_external") as throwaway:
            yield throwaway
        return
    with tempfile.TemporaryDirectory() as directory:
        yield f"sqlite:///{Path(directory) / 'bench.sqlite3'}"


def build(rounds: int, tool_name: str, node: Any) -> Any:
    answers = [
        AIMessage(
            content="",
            tool_calls=[{"id": f"c{i}", "name": tool_name, "args": {"n": i}, "type": "tool_call"}],
        )
        for i in range(rounds)
    ] + [AIMessage(content="done")]

    class Scripted(FakeMessagesListChatModel):
        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            answered = sum(isinstance(m, AIMessage) for m in messages)
            return ChatResult(generations=[ChatGeneration(message=answers[answered])])

    model = Scripted(responses=answers)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


class Counter:
    def __init__(self) -> None:
        self.statements = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements += 1
        return execute(sql, params, many, context)


def measure(rounds: int, runs: int, workload: str) -> dict[str, float]:
    import uuid

    from django.db import connection
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import ToolNode as PlainToolNode

    from agentruns.external import langgraph as lh
    from agentruns.models import AgentConfiguration, Effect

    name = f"bench_{workload}"

    @lc_tool(name)
    def noop(n: int) -> dict[str, int]:
        """Does nothing and says so."""
        return {"n": n}

    effect = Effect.READ if workload == "read" else Effect.IDEMPOTENT_WRITE
    lh.leasehold_tool(noop, effect=effect, requires_approval=False)
    AgentConfiguration.objects.get_or_create(slug=name, defaults={"name": name, "tools": [name]})
    plain = build(rounds, name, PlainToolNode([noop]))
    leased = build(rounds, name, lh.ToolNode())
    alone: list[float] = []
    under: list[float] = []
    statements: list[float] = []
    for index in range(runs + 1):  # the first pair warms up
        started = time.perf_counter()
        plain.invoke(
            {"messages": [HumanMessage("go")]},
            {"configurable": {"thread_id": str(uuid.uuid4())}},
            durability="sync",
        )
        alone_ms = (time.perf_counter() - started) * 1000
        counter = Counter()
        started = time.perf_counter()
        with connection.execute_wrapper(counter):
            result = lh.start(leased, configuration=name, prompt="go")
        under_ms = (time.perf_counter() - started) * 1000
        assert result.status == "completed", result
        if index:
            alone.append(alone_ms / rounds)
            under.append(under_ms / rounds)
            statements.append(counter.statements / rounds)
    a, u = statistics.median(alone), statistics.median(under)
    return {
        "langgraph_ms_per_round": round(a, 3),
        "leasehold_ms_per_round": round(u, 3),
        "overhead_ms_per_call": round(u - a, 3),
        "ratio": round(u / a, 2),
        "statements_per_round": round(statistics.median(statements), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="tool calls per run")
    parser.add_argument("--runs", type=int, default=15, help="runs per workload and side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with database() as url:
        _environment(url)
        from django.db import connection

        figures: dict[str, Any] = {"database": connection.vendor}
        print(f"{connection.vendor}: {args.runs} runs of {args.rounds} rounds per side, medians")
        print(
            f"{'workload':<8} {'LangGraph alone':>16} {'under Leasehold':>16} {'ratio':>6}"
            f" {'+ms/call':>9} {'statements':>11}"
        )
        for workload in ("read", "write"):
            result = measure(args.rounds, args.runs, workload)
            figures[workload] = result
            print(
                f"{workload:<8} {result['langgraph_ms_per_round']:>13.2f} ms"
                f" {result['leasehold_ms_per_round']:>13.2f} ms {result['ratio']:>5.1f}x"
                f" {result['overhead_ms_per_call']:>9.2f} {result['statements_per_round']:>11.1f}"
            )
        if args.json:
            print(json.dumps(figures))


if __name__ == "__main__":
    main()
