#!/usr/bin/env python
"""Bytes stored per run against the dialogue's own size (issue 11 §12).

Runs one scripted run of ``--rounds`` tool rounds (each answer and result about ``--chars``
characters) against a throwaway SQLite file, then prints: the dialogue's own size (the JSON of
the last request's messages: everything the model was sent), the bytes the run's events store,
their ratio, and — measured on the same run — what storing each request's whole dialogue, as
request events did before, would have cost.

    .venv/bin/python benchmarks/storage_per_run.py --rounds 20
    .venv/bin/python benchmarks/storage_per_run.py --json   # last line: {"rounds", "events", …}

Goal: stored <= 1.2 x the dialogue, plus a fixed cost per event.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--chars", type=int, default=400, help="characters per answer")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
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
        figures = measure(args.rounds, args.chars)
        if args.json:
            print(json.dumps(figures))
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(directory, ignore_errors=True)


def measure(rounds: int, chars: int) -> dict[str, float]:
    from agentruns.models import AgentConfiguration, AgentRunEvent, EventKind
    from agentruns.services import runs
    from agentruns.services.runtime.transcript import request_messages

    text = ("lorem ipsum " * (chars // 12 + 1))[:chars]
    script = [
        {"content": text, "tool_calls": [{"name": "wait", "arguments": {"seconds": 0}}]}
        for _ in range(rounds)
    ] + [{"content": text}]
    configuration = AgentConfiguration.objects.create(
        slug="storage-bench",
        name="storage bench",
        script=script,
        system_prompt="Be brief.",
        max_iterations=rounds + 1,
    )
    run = runs.run_start_sync(configuration=configuration, prompt=text).run
    events = list(AgentRunEvent.objects.filter(run=run).order_by("sequence"))
    sent = request_messages(run, events)
    dialogue = len(json.dumps(list(sent.values())[-1]))
    stored = sum(len(json.dumps(e.payload)) for e in events)
    requests = [e for e in events if e.kind == EventKind.REQUEST]
    before = stored + sum(len(json.dumps(sent[e.sequence])) for e in requests)
    print(f"{rounds} rounds, {len(events)} events, answers of {chars} characters")
    print(f"  dialogue (last request's messages): {dialogue:>9} bytes")
    print(f"  stored by the run's events:         {stored:>9} bytes -> {stored / dialogue:.2f}x")
    print(f"  per event beyond the dialogue:      {(stored - dialogue) / len(events):>9.0f} bytes")
    print(
        f"  baseline, whole dialogue per request (as before): {before} bytes -> "
        f"{before / dialogue:.2f}x ({before / stored:.1f}x what is stored now)"
    )
    return {
        "rounds": rounds,
        "events": len(events),
        "dialogue_bytes": dialogue,
        "stored_bytes": stored,
        "ratio_to_dialogue": round(stored / dialogue, 3),
    }


if __name__ == "__main__":
    main()
