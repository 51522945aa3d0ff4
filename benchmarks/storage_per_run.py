#!/usr/bin/env python
"""Bytes stored per run against the dialogue's own size (issue 11 §12).

Runs a scripted run of ``--rounds`` tool rounds against a throwaway SQLite file. Each round the
model answers ``--chars`` characters and calls a read tool (``bench_echo``, registered here) with
an argument of ``--chars`` characters, whose result is ``--chars`` characters too: everything
the dialogue holds grows with ``--chars``. The same script runs once more with empty texts, so
the fixed cost of the events (ids, kinds, usage, keys...) is measured, not guessed.

Printed: the dialogue's own size (the JSON of the last request's messages: everything the model
was sent), the bytes the run's events store, the fixed cost per event, and the goal's test —
stored <= 1.2 x dialogue + the fixed cost of the run's events — and, on the same run, what
storing each request's whole dialogue (as request events did before) would have cost.

    .venv/bin/python benchmarks/storage_per_run.py --rounds 20 [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chars", type=int, default=400, help="characters per text")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="leasehold-storage-")
    try:
        from benchmarks._support import setup_django

        setup_django(
            {
                "DATABASE_URL": f"sqlite:///{os.path.join(directory, 'bench.sqlite3')}",
                "DJANGO_SETTINGS_MODULE": "config.settings.local",
                "LOG_LEVEL": "ERROR",
                "AGENTRUNS_MAX_ITERATIONS": str(args.rounds + 1),
            }
        )
        report(args.rounds, args.chars, as_json=args.json)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def register_echo() -> None:
    from agentruns.models import Effect
    from agentruns.tools import registry, tool

    @tool(
        name="bench_echo",
        description="Answers with text as long as the text it is given.",
        effect=Effect.READ,
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
    )
    def bench_echo(context: object, arguments: dict[str, str]) -> dict[str, str]:
        return {"echo": arguments["text"].upper()}

    registry.register(bench_echo)


def measure(rounds: int, chars: int, slug: str) -> dict[str, int]:
    import json

    from agentruns.models import AgentConfiguration, AgentRunEvent, EventKind
    from agentruns.services import runs
    from agentruns.services.runtime.transcript import request_messages

    text = ("lorem ipsum " * (chars // 12 + 1))[:chars]
    script = [
        {"content": text, "tool_calls": [{"name": "bench_echo", "arguments": {"text": text}}]}
        for _ in range(rounds)
    ] + [{"content": text}]
    configuration = AgentConfiguration.objects.create(
        slug=slug,
        name=slug,
        script=script,
        system_prompt="Be brief.",
        tools=["bench_echo"],
        max_iterations=rounds + 1,
    )
    run = runs.run_start_sync(configuration=configuration, prompt=text or "go").run
    assert run.status == "completed", (run.status, run.termination_reason)
    events = list(AgentRunEvent.objects.filter(run=run).order_by("sequence"))
    sent = request_messages(run, events)
    requests = [e for e in events if e.kind == EventKind.REQUEST]
    stored = sum(len(json.dumps(e.payload)) for e in events)
    return {
        "events": len(events),
        "dialogue": len(json.dumps(list(sent.values())[-1])),
        "stored": stored,
        "whole_dialogue_per_request": stored
        + sum(len(json.dumps(sent[e.sequence])) for e in requests),
    }


def report(rounds: int, chars: int, *, as_json: bool) -> None:
    import json

    register_echo()
    empty = measure(rounds, 0, "storage-bench-empty")
    full = measure(rounds, chars, "storage-bench")
    fixed_per_event = empty["stored"] / empty["events"]
    allowed = 1.2 * full["dialogue"] + fixed_per_event * full["events"]
    ratio = full["stored"] / full["dialogue"]
    marginal = (full["stored"] - empty["stored"]) / (full["dialogue"] - empty["dialogue"])
    before = full["whole_dialogue_per_request"]
    print(f"{rounds} rounds, {full['events']} events, texts of {chars} characters")
    print(f"  dialogue (last request's messages): {full['dialogue']:>9} bytes")
    print(f"  stored by the run's events:         {full['stored']:>9} bytes -> {ratio:.2f}x")
    print(f"  fixed cost per event (empty texts): {fixed_per_event:>9.0f} bytes")
    print(
        f"  stored per byte the dialogue grows: {marginal:>9.2f} "
        f"(goal: stored <= 1.2 x dialogue + fixed cost = {allowed:.0f} bytes: "
        f"{'met' if full['stored'] <= allowed else 'NOT met'})"
    )
    print(
        f"  baseline, whole dialogue per request (as before): {before} bytes -> "
        f"{before / full['dialogue']:.2f}x ({before / full['stored']:.1f}x what is stored now)"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "rounds": rounds,
                    "chars": chars,
                    "events": full["events"],
                    "dialogue_bytes": full["dialogue"],
                    "stored_bytes": full["stored"],
                    "fixed_bytes_per_event": round(fixed_per_event, 1),
                    "stored_per_dialogue_byte": round(marginal, 3),
                    "goal_met": full["stored"] <= allowed,
                    "baseline_whole_dialogue_bytes": before,
                }
            )
        )


if __name__ == "__main__":
    main()
