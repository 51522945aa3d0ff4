"""``manage.py purge_runs --older-than DAYS [--dry-run] [--batch-size N]``: retention
(``agentruns.services.retention``)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentruns.management.commands.reap_stale_runs import positive_int
from agentruns.services import retention


def days(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of days, 0 or more, got {raw!r}")
    return value


class Command(BaseCommand):
    help = (
        "Delete completed, failed and cancelled runs that finished more than DAYS days ago "
        "(database clock), with their events, in batches. Waiting, running, queued and in-doubt "
        "runs are never deleted. --older-than 0 deletes every finished run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=days,
            required=True,
            metavar="DAYS",
            help="Delete runs that finished more than DAYS days ago (a whole number, 0 or more; "
            "0: every finished run).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=retention.DEFAULT_BATCH_SIZE,
            help=f"Runs deleted per transaction (default {retention.DEFAULT_BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(runs: int, events: int) -> None:
            self.stdout.write(f"batch: removed {runs} run(s) and {events} event(s)")

        result = retention.runs_purge(
            older_than_days=options["older_than"],
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            on_batch=progress if options["verbosity"] >= 2 else None,
        )
        self.stdout.write(result.summary())  # the one line it prints (the service logs nothing)
