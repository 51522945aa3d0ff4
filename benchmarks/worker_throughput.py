#!/usr/bin/env python
"""Queued scripted runs per second with 1 and 2 django-q2 workers on PostgreSQL, beside the
throughput of empty django-q2 tasks measured in the same run (the floor the engine sets).

    DATABASE_URL=postgres://root@127.0.0.1:5432/test \
        .venv/bin/python benchmarks/worker_throughput.py
    ... benchmarks/worker_throughput.py --runs 300 --workers 1,2 --conn-max-age 0,60
    ... benchmarks/worker_throughput.py --json   # last line: {"empty_tasks_per_s": …, …}

Creates (and drops) a THROWAWAY database ``leasehold_workers_<pid>`` on the server of
``DATABASE_URL`` and starts real ``manage.py qcluster`` processes on it (ORM broker, the
settings' defaults but ``Q_WORKERS``/``Q_QUEUE_LIMIT``). For each worker count:

1. **empty tasks**: N ``async_task`` of a function that returns at once, committed together;
   the clock runs from that commit until django-q2 has saved all N results;
2. **runs**: N queued runs of the scripted provider, three rounds each (three calls of a read
   tool, then an answer: four model turns), committed together with their wake-ups; the clock
   runs until every run is terminal.

A warm-up task is processed before each clock starts, so cluster start-up is not counted. Each
combination runs with ``DATABASE_CONN_MAX_AGE`` 60 (persistent connections; the issue's
setting) unless ``--conn-max-age`` names others (0: django-q2 closes and reopens the database
connection around every task).

``--profile SECONDS`` also samples the one-worker cluster with py-spy (the dev extra; needs
ptrace: root or ``CAP_SYS_PTRACE``) for that long while it works through the runs, and prints
where the worker process spent its time: each function of ours, and the statements it waits on,
as a share of the worker's samples (py-spy counts a wait on the database as busy).

With ``--json`` the last line is one JSON object for the last ``--conn-max-age`` given:
``{"empty_tasks_per_s": {"1": …, "2": …}, "runs_per_s": {"1": …, "2": …}}`` (keys: workers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._support import (
    ROOT,
    postgres_server,
    production_environment,
    setup_django,
    throwaway_postgres,
)

EMPTY_TASK = "benchmarks.worker_throughput.empty"
PROFILE_FILE = os.path.join(tempfile.gettempdir(), f"leasehold-worker-profile-{os.getpid()}.txt")
OURS = (
    "process_run",
    "run_",
    "continue_segment",
    "segment_write",
    "guarded_write",
    "insert_events",
)
OURS += ("_segment_update", "rehydrate", "ask_model", "invoke_tool", "list_notes")
ROUND = {"tool_calls": [{"name": "list_notes", "arguments": {}}]}
SCRIPT = [ROUND, ROUND, ROUND, {"content": "done"}]


def empty() -> None:
    """The empty task: django-q2's own cost per task, nothing of ours."""
    return None


@contextmanager
def cluster(url: str, workers: int, conn_max_age: int) -> Iterator[subprocess.Popen]:
    env = production_environment(url)
    env.update(
        Q_WORKERS=str(workers),
        Q_QUEUE_LIMIT=str(workers),
        DATABASE_CONN_MAX_AGE=str(conn_max_age),
    )
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)  # the main PID only (DJANGO-Q2.md)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(predicate, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not finish in time")
        time.sleep(0.05)


def warm_up() -> None:
    from django_q.models import Task
    from django_q.tasks import async_task

    async_task(EMPTY_TASK, group="warm-up")
    wait_for(lambda: Task.objects.filter(group="warm-up").exists(), timeout=120)


def empty_tasks_per_second(n: int) -> float:
    from django.db import transaction
    from django_q.models import Task
    from django_q.tasks import async_task

    Task.objects.all().delete()
    with transaction.atomic():
        for _ in range(n):
            async_task(EMPTY_TASK, group="empty")
    started = time.perf_counter()
    wait_for(lambda: Task.objects.filter(group="empty").count() >= n)
    return n / (time.perf_counter() - started)


def worker_profile(cluster_pid: int, seconds: int) -> subprocess.Popen:
    """py-spy sampling the cluster (and its worker processes) for ``seconds``, in raw form."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            *("record", "--subprocesses", "--nonblocking", "--format", "raw", "--rate", "200"),
            *("--pid", str(cluster_pid), "--duration", str(seconds), "--output", PROFILE_FILE),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def print_profile(lines: int = 25) -> None:
    """The worker process's samples: inclusive share of each function of ours (and django-q2's
    task loop), from py-spy's raw stacks."""
    inclusive: Counter[str] = Counter()
    worker_samples = 0
    with open(PROFILE_FILE) as stacks:
        for line in stacks:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if "worker (django_q/worker.py" not in stack:
                continue  # the sentinel, pusher and monitor processes
            worker_samples += int(count)
            names = {re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")}
            for name in names:
                if name.startswith(OURS):
                    inclusive[name] += int(count)
    os.remove(PROFILE_FILE)
    print(f"\nworker process, {worker_samples} samples (py-spy, 200/s), inclusive share:")
    for name, count in inclusive.most_common(lines):
        print(f"  {count / max(worker_samples, 1):6.1%}  {name}")


def runs_per_second(
    n: int, profile_pid: int = 0, profile_s: int = 0
) -> tuple[float, dict[str, int]]:
    from django.db import transaction
    from django.db.models import Count

    from agentruns import transitions
    from agentruns.models import TERMINAL_STATUSES, AgentConfiguration, AgentRun
    from agentruns.services import dispatch

    configuration, _ = AgentConfiguration.objects.get_or_create(
        slug="bench", defaults={"name": "bench", "tools": ["list_notes"], "script": SCRIPT}
    )
    AgentRun.objects.all().delete()
    with transaction.atomic():  # the ORM broker's task rows commit with the runs
        for number in range(n):
            run = transitions.run_enqueue(
                configuration=configuration,
                initiator_id=None,
                prompt=f"run {number}",
                request={"prompt": f"run {number}", "script": SCRIPT},
            )
            dispatch.send_wakeup(str(run.uuid))
    started = time.perf_counter()
    spy = worker_profile(profile_pid, profile_s) if profile_s else None
    wait_for(lambda: not AgentRun.objects.exclude(status__in=TERMINAL_STATUSES).exists())
    elapsed = time.perf_counter() - started
    if spy is not None:
        spy.wait()
        print_profile()
    outcome = AgentRun.objects.values("status").annotate(n=Count("pk")).order_by()
    return n / elapsed, {row["status"]: row["n"] for row in outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs (and empty tasks) per phase")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument(
        "--conn-max-age",
        default="60",
        help="DATABASE_CONN_MAX_AGE values for the cluster (0, the default, reconnects per task)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="SECONDS", help="py-spy the 1-worker cluster"
    )
    args = parser.parse_args()
    server = postgres_server("worker_throughput")

    with throwaway_postgres(server, "leasehold_workers") as url:
        setup_django(production_environment(url))
        rows = []
        for conn_max_age in [int(c) for c in args.conn_max_age.split(",")]:
            for workers in [int(w) for w in args.workers.split(",")]:
                with cluster(url, workers, conn_max_age) as proc:
                    warm_up()
                    empty_rate = empty_tasks_per_second(args.runs)
                    profile_s = args.profile if workers == 1 else 0
                    run_rate, statuses = runs_per_second(args.runs, proc.pid, profile_s)
                rows.append((conn_max_age, workers, empty_rate, run_rate))
                print(
                    f"CONN_MAX_AGE={conn_max_age}, {workers} worker(s): empty tasks "
                    f"{empty_rate:.1f}/s, runs {run_rate:.1f}/s {statuses}",
                    flush=True,
                )

        print(f"\n{args.runs} per phase, PostgreSQL, ORM broker, cpu count {os.cpu_count()}")
        print("CONN_MAX_AGE  workers  empty tasks/s  runs/s  runs vs empty tasks")
        for conn_max_age, workers, empty_rate, run_rate in rows:
            ratio = run_rate / empty_rate
            print(
                f"{conn_max_age:>12} {workers:>8} {empty_rate:>14.1f} {run_rate:>7.1f}"
                f" {ratio:>20.0%}"
            )
        if args.json:
            last = rows[-1][0]
            print(
                json.dumps(
                    {
                        "empty_tasks_per_s": {
                            str(w): round(e, 2) for c, w, e, _ in rows if c == last
                        },
                        "runs_per_s": {str(w): round(r, 2) for c, w, _, r in rows if c == last},
                    }
                )
            )


if __name__ == "__main__":
    main()
