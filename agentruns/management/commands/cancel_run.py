"""``manage.py cancel_run <uuid>``: cancel a run that has not ended.

Exit status: 0 cancelled; 1 not cancelled because the run already ended (the message names its
status); 2 no such run, or bad arguments. ``call_command`` raises ``CommandError`` with that
``returncode`` for 1 and 2.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns import selectors
from agentruns.exceptions import RunNotFound
from agentruns.services import runs

EXIT_ALREADY_ENDED = 1
EXIT_NOT_FOUND_OR_BAD_ARGUMENTS = 2


class Command(BaseCommand):
    help = (
        "Cancel a run that has not ended. A segment holding it notices at its next step "
        "boundary and stops; a terminal run is left as it is. Exit status: 0 cancelled, "
        "1 already ended (its status is named), 2 no such run or bad arguments."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # Parsed in handle(), so a malformed uuid exits 2 from call_command too (argparse's own
        # errors, such as a missing argument, exit 2 from the command line).
        parser.add_argument("run_uuid", help="The run's uuid.")
        parser.add_argument("--note", default="", help="Recorded in the cancel event.")

    def handle(self, *args: Any, **options: Any) -> None:
        raw = options["run_uuid"]
        try:
            target = uuid.UUID(str(raw))
        except ValueError:
            raise CommandError(
                f"not a run uuid: {raw!r}", returncode=EXIT_NOT_FOUND_OR_BAD_ARGUMENTS
            ) from None
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
