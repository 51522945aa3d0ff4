"""``manage.py reap_stale_runs [--limit N] [--dry-run]``: one reaper pass (docs/design.md §8.5)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentruns.services import reaper


def positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {raw!r}")
    return value


class Command(BaseCommand):
    help = (
        "Settle runs whose lease expired: in doubt (a non-idempotent write was in flight), "
        "dead-lettered (not rehydratable or out of retries) or requeued; settle runs waiting for "
        "approval or input past their deadline (deny or fail); then redispatch queued runs "
        "nobody claimed. Prints one line per run and a summary."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit", type=positive_int, default=None, help="Judge at most N stale runs."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print the verdicts; change nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=reaper.BATCH_SIZE,
            help=f"Runs locked per transaction (default {reaper.BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = reaper.reap_stale_runs(
            limit=options["limit"], dry_run=options["dry_run"], batch_size=options["batch_size"]
        )
        for verdict in [*report.verdicts, *report.expired]:
            self.stdout.write(verdict.line())
        self.stdout.write(report.summary())
