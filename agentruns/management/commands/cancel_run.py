"""``manage.py cancel_run <uuid>``: cancel a run that has not ended."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns import selectors
from agentruns.exceptions import RunNotFound
from agentruns.services import runs


def run_uuid(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run uuid: {raw!r}") from None


class Command(BaseCommand):
    help = (
        "Cancel a run that has not ended. A segment holding it notices at its next step "
        "boundary and stops; a terminal run is left as it is."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_uuid", type=run_uuid, help="The run's uuid.")
        parser.add_argument("--note", default="", help="Recorded in the cancel event.")

    def handle(self, *args: Any, **options: Any) -> None:
        target = options["run_uuid"]
        note = options["note"] or "cancelled with manage.py cancel_run"
        try:
            cancelled = runs.run_cancel(run_uuid=target, note=note)
        except RunNotFound:
            raise CommandError(f"no run {target}") from None
        if cancelled:
            self.stdout.write(f"cancelled {target}")
            return
        status = selectors.run_get(run_uuid=target, user=None).status  # the server sees every run
        self.stdout.write(f"{target} not cancelled: it already ended ({status})")
