"""``manage.py verify_ledger [--run UUID] [--since DATE]``: prove that runs' histories are the
ones that were written (``agentruns.audit.verify``).

Exit status: 0 every run checked is intact ("N runs, M events intact"); 1 at least one is broken
(each is named with its first bad sequence and what is wrong there: changed, missing, reordered,
head mismatch); 2 bad arguments or no such run. ``call_command`` raises ``CommandError`` with
that ``returncode`` for 1 and 2.
"""

from __future__ import annotations

import uuid
from datetime import datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from agentruns import audit
from agentruns.models import AgentRun

EXIT_BROKEN = 1
EXIT_BAD_ARGUMENTS = 2


def _since(raw: str) -> datetime:
    moment = parse_datetime(raw)
    if moment is None:
        day = parse_date(raw)
        if day is None:
            raise ValueError(raw)
        moment = datetime.combine(day, time.min)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    return moment


class Command(BaseCommand):
    help = (
        "Verify the tamper-evident chain of every run's events (or one run's, or the runs "
        "updated since a date). Exit status: 0 intact, 1 broken runs (each named with its "
        "first bad sequence), 2 bad arguments or no such run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", dest="run_uuid", help="Only this run (its uuid).")
        parser.add_argument(
            "--since",
            help="Only runs updated on or after this date (YYYY-MM-DD, or an ISO date-time).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        run_uuid = None
        if options.get("run_uuid"):
            try:
                run_uuid = uuid.UUID(str(options["run_uuid"]))
            except ValueError:
                raise CommandError(
                    f"not a run uuid: {options['run_uuid']!r}", returncode=EXIT_BAD_ARGUMENTS
                ) from None
            if not AgentRun.objects.filter(uuid=run_uuid).exists():
                raise CommandError(f"no run {run_uuid}", returncode=EXIT_BAD_ARGUMENTS)
        since = None
        if options.get("since"):
            try:
                since = _since(str(options["since"]))
            except ValueError:
                raise CommandError(
                    f"not a date: {options['since']!r} (YYYY-MM-DD or an ISO date-time)",
                    returncode=EXIT_BAD_ARGUMENTS,
                ) from None
        report = audit.verify(run_uuid=run_uuid, since=since)
        for broken in report.broken:
            self.stdout.write(broken.line())
        if not report.intact:
            raise CommandError(report.summary(), returncode=EXIT_BROKEN)
        self.stdout.write(report.summary())
