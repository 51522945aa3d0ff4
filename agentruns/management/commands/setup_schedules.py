"""``manage.py setup_schedules``: create or update Leasehold's django-q2 schedules."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agentruns.services.schedules import schedules_setup


class Command(BaseCommand):
    help = (
        "Create or update Leasehold's django-q2 schedules: the reaper, the retention purge "
        "when AGENTRUNS_RETENTION_DAYS is above 0, and the notification pass when "
        "AGENTRUNS_NOTIFY_INTERVAL is above 0, and the pass starting scheduled runs. "
        "Idempotent."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        for state in schedules_setup():
            if state.removed:
                self.stdout.write(f"removed schedule {state.name!r}: {state.reason}")
                continue
            self.stdout.write(
                f"{'created' if state.created else 'updated'} schedule {state.name!r}: "
                f"{state.func} every {state.minutes} minute(s)"
            )
