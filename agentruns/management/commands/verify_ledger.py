"""``manage.py verify_ledger [--run RUN] [--since DATE] [--allow-plain]``: prove that runs'
histories are the ones that were written (``agentruns.audit.verify``). ``RUN`` is a run's uuid or
its start (the short id the pages show) when only one run starts so.

The first line says which mode it checked in: plain SHA-256 (no ``AGENTRUNS_LEDGER_KEY``) or
keyed HMAC-SHA256 under the configured key (its id). Exit status: 0 every run checked is intact
("N runs, M events intact (… keyed, … plain, … version 1)"); 1 at least one is broken (each is
named with its first bad sequence and what is wrong there: changed, missing, reordered, head
mismatch, not keyed, downgraded); 2 bad arguments or no such run; 3 it cannot verify as asked:
the ledger is keyed and no key is configured, the configured key is not the one its events were
chained under, or the configured key cannot be read. ``call_command`` raises ``CommandError``
with that ``returncode`` for 1, 2 and 3.
"""

from __future__ import annotations

from datetime import datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from agentruns import audit, selectors
from agentruns.exceptions import AmbiguousRunId, LedgerKeyUnavailable, RunNotFound

EXIT_BROKEN = 1
EXIT_BAD_ARGUMENTS = 2
EXIT_CANNOT_VERIFY = 3


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
        "updated since a date), keyed under AGENTRUNS_LEDGER_KEY when it is set. Exit status: "
        "0 intact, 1 broken runs (each named with its first bad sequence), 2 bad arguments, "
        "no such run or an ambiguous short id, 3 a keyed ledger without its key (or with "
        "another key)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--run",
            dest="run_uuid",
            metavar="RUN",
            help="Only this run: its uuid, or its start (the short id the pages show) when only "
            "one run starts so.",
        )
        parser.add_argument(
            "--since",
            help="Only runs updated on or after this date (YYYY-MM-DD, or an ISO date-time).",
        )
        parser.add_argument(
            "--allow-plain",
            action="store_true",
            help="With a key configured, also accept events chained without it (written before "
            "the key was set); they are counted apart. Anyone who can write the table could "
            "have written those.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        run_uuid = None
        if options.get("run_uuid"):
            try:
                run_uuid = selectors.run_uuid_for(text=str(options["run_uuid"]))
            except (RunNotFound, AmbiguousRunId) as exc:
                raise CommandError(exc.message, returncode=EXIT_BAD_ARGUMENTS) from None
        since = None
        if options.get("since"):
            try:
                since = _since(str(options["since"]))
            except ValueError:
                raise CommandError(
                    f"not a date: {options['since']!r} (YYYY-MM-DD or an ISO date-time)",
                    returncode=EXIT_BAD_ARGUMENTS,
                ) from None
        try:
            report = audit.verify(
                run_uuid=run_uuid, since=since, allow_plain=bool(options.get("allow_plain"))
            )
        except LedgerKeyUnavailable as exc:
            self.stdout.write("mode: keyed HMAC-SHA256 (AGENTRUNS_LEDGER_KEY)")
            raise CommandError(
                f"cannot verify: {exc.message}", returncode=EXIT_CANNOT_VERIFY
            ) from None
        self.stdout.write(report.mode)
        for broken in report.broken:
            self.stdout.write(broken.line())
        if report.needs_key:
            raise CommandError(
                "cannot verify: the ledger is keyed (HMAC-SHA256) and no key is configured; set "
                "AGENTRUNS_LEDGER_KEY to the name of the environment variable holding its key",
                returncode=EXIT_CANNOT_VERIFY,
            )
        if report.wrong_key:
            assert report.key is not None
            raise CommandError(
                f"cannot verify: events were chained under the key "
                f"{', '.join(sorted(report.wrong_key))}, not under the configured key "
                f"{report.key.id}: the wrong key (or their key ids were altered)",
                returncode=EXIT_CANNOT_VERIFY,
            )
        if not report.intact:
            raise CommandError(report.summary(), returncode=EXIT_BROKEN)
        self.stdout.write(report.summary())
