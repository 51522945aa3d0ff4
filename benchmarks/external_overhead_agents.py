#!/usr/bin/env python
"""What Leasehold's guarantees cost per tool call of an OpenAI Agents SDK agent.

The same agent, the same scripted model (no network) and the same tool bodies, run two ways in
the same process, alternated run by run so that each pair sees the same machine load:

* ``sdk``: ``Runner.run`` alone, the tools plain ``@function_tool``s;
* ``leasehold``: ``agentruns.external.openai_agents.start``, the tools made with
  ``leasehold_tool``: the run opened and claimed, each model answer proposed (an ``llm``
  event), each call executed through the run (its ``tool`` event; a write fenced: stamp and
  clear under the owner guard), the lease renewed by the ticker, the run settled.

Workloads, ``CALLS`` calls per run (one per model answer, then a final answer): ``read`` (a read
tool: passes without approval) and ``write`` (an idempotent write exempt from approval, so it
runs fenced without the inbox: the fence's cost, not a person's). The tool bodies do nothing.

    .venv/bin/python benchmarks/external_overhead_agents.py            # a temporary SQLite file
    DATABASE_URL=postgres://root@127.0.0.1:5432/postgres \
        .venv/bin/python benchmarks/external_overhead_agents.py

With a PostgreSQL ``DATABASE_URL`` it creates (and drops) ``leasehold_agents_<pid>`` on that
server. Prints, per workload, the median milliseconds per call both ways, the difference (what
the guarantees cost per call) and the ratio; ``--json`` ends with one JSON object.
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

from benchmarks._support import is_postgres, setup_django, throwaway_postgres  # noqa: E402

CALLS = 8  # calls per run: 8 model answers with a call and a final one (the SDK allows 10)


@contextmanager
def database() -> Iterator[str]:
    configured = os.environ.get("DATABASE_URL", "")
    if is_postgres(configured):
        with throwaway_postgres(configured, "leasehold_agents") as url:
            yield url
        return
    yield f"sqlite:///{tempfile.mkdtemp(prefix='leasehold-agents-')}/bench.sqlite3"


def script(name: str) -> list[Any]:
    from agentruns.external.openai_agents.scripted import call, say

    turns: list[Any] = [[call(name, {}, call_id=f"call_{i}")] for i in range(CALLS)]
    return [*turns, [say("done")]]


def agents_for(workload: str) -> tuple[Any, Any]:
    """The plain agent and the guarded one, for ``workload``."""
    from agents import Agent, function_tool

    from agentruns.external import openai_agents
    from agentruns.external.openai_agents.scripted import ScriptedTurns
    from agentruns.models import Effect

    @function_tool(name_override=f"bench_{workload}")
    def body() -> str:
        """Does nothing."""
        return "ok"

    effect = Effect.READ if workload == "read" else Effect.IDEMPOTENT_WRITE
    guarded = openai_agents.leasehold_tool(body, effect=effect, requires_approval=False)
    plain = Agent(name="bench", tools=[body], model=ScriptedTurns(script(body.name)))
    leased = Agent(name="bench", tools=[guarded], model=ScriptedTurns(script(body.name)))
    return plain, leased


def time_sdk(agent: Any) -> float:
    from agents import Runner
    from asgiref.sync import async_to_sync

    started = time.perf_counter()
    result = async_to_sync(Runner.run)(agent, "go")
    elapsed = time.perf_counter() - started
    assert result.final_output == "done"
    return elapsed


def time_leasehold(agent: Any, configuration: Any) -> float:
    from agentruns.external import openai_agents

    started = time.perf_counter()
    result = openai_agents.start(agent, prompt="go", configuration=configuration)
    elapsed = time.perf_counter() - started
    assert result.outcome == openai_agents.COMPLETED, result
    return elapsed


def measure(workload: str, runs: int, configuration: Any) -> dict[str, float]:
    plain, leased = agents_for(workload)
    time_sdk(plain), time_leasehold(leased, configuration)  # warm up both paths
    sdk, leasehold = [], []
    for _ in range(runs):
        sdk.append(time_sdk(plain) / CALLS * 1000)
        leasehold.append(time_leasehold(leased, configuration) / CALLS * 1000)
    sdk_ms, leasehold_ms = statistics.median(sdk), statistics.median(leasehold)
    return {
        "sdk_ms_per_call": round(sdk_ms, 3),
        "leasehold_ms_per_call": round(leasehold_ms, 3),
        "added_ms_per_call": round(leasehold_ms - sdk_ms, 3),
        "ratio": round(leasehold_ms / sdk_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per workload and way")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    with database() as url:
        setup_django(
            {
                "DATABASE_URL": url,
                "DJANGO_SETTINGS_MODULE": "config.settings.local",
                "LOG_LEVEL": "ERROR",
            }
        )
        from agents import set_tracing_disabled

        from agentruns.models import AgentConfiguration

        set_tracing_disabled(True)
        configuration = AgentConfiguration.objects.create(slug="bench", name="Bench", tools=[])
        kind = "postgresql" if is_postgres(url) else "sqlite"
        figures = {w: measure(w, args.runs, configuration) for w in ("read", "write")}
        print(f"\n{kind}: {CALLS} calls per run, median of {args.runs} runs per way")
        print("workload   SDK alone ms/call   through Leasehold ms/call   added ms/call   ratio")
        for workload, f in figures.items():
            print(
                f"{workload:<10} {f['sdk_ms_per_call']:>17.3f}"
                f"   {f['leasehold_ms_per_call']:>25.3f}"
                f"   {f['added_ms_per_call']:>13.3f}   {f['ratio']:>5.2f}x"
            )
        if args.json:
            print(json.dumps({"database": kind, "calls_per_run": CALLS, **figures}))


if __name__ == "__main__":
    main()
