"""``manage.py cancel_run <run id>``: cancel a run that has not ended. The run is named by its
uuid or by its start (the short id the pages show), when only one run starts so.

Exit status: 0 cancelled; 1 not cancelled because the run already ended (the message names its
status); 2 no such run, more than one run starting with that id, or bad arguments.
``call_command`` raises ``CommandError`` with that ``returncode`` for 1 and 2.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns import selectors
from agentruns.exceptions import AmbiguousRunId, RunNotFound
from agentruns.services import runs

EXIT_ALREADY_ENDED = 1
EXIT_NOT_FOUND_OR_BAD_ARGUMENTS = 2


class Command(BaseCommand):
    help = (
        "Cancel a run that has not ended. A segment holding it notices at its next step "
        "boundary and stops; a terminal run is left as it is. Exit status: 0 cancelled, "
        "1 already ended (its status is named), 2 no such run, an ambiguous short id or bad "
        "arguments."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Parsed in handle(), so a malformed id exits 2 from call_command too (argparse's own
        # errors, such as a missing argument, exit 2 from the command line).
        parser.add_argument(
            "run_uuid",
            metavar="RUN",
            help="The run's uuid, or its start (the short id the pages show) when only one run "
            "starts so.",
        )
        parser.add_argument("--note", default="", help="Recorded in the cancel event.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            target = selectors.run_uuid_for(text=str(options["run_uuid"]))
        except (RunNotFound, AmbiguousRunId) as exc:
            raise CommandError(exc.message, returncode=EXIT_NOT_FOUND_OR_BAD_ARGUMENTS) from None
        note = options["note"] or "cancelled with manage.py cancel_run"
        try:
            cancelled = runs.run_cancel(run_uuid=target, note=note)
            if cancelled:
                self.stdout.write(f"cancelled {target}")
                return
            status = selectors.run_get(run_uuid=target, user=None).status  # the server sees all
        except RunNotFound:
            raise CommandError(
                f"no run {target}", returncode=EXIT_NOT_FOUND_OR_BAD_ARGUMENTS
            ) from None
        raise CommandError(
            f"{target} not cancelled: it already ended ({status})", returncode=EXIT_ALREADY_ENDED
        )
