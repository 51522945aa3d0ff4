"""The django-q2 schedules Leasehold needs, created or updated idempotently.

Two clusters racing never enqueue one schedule twice (django-q2's scheduler locks due rows), and
the reaper tolerates overlapping with itself anyway (docs/design.md §8.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from agentruns import conf

REAPER_SCHEDULE = "agentruns: reap stale runs"
REAPER_TASK = "agentruns.tasks.reap_stale_runs"


@dataclass(frozen=True)
class ScheduleState:
    name: str
    func: str
    minutes: int
    created: bool


def schedules_setup() -> list[ScheduleState]:
    """Create or update the reaper's ``Schedule`` (every ``REAPER_INTERVAL_MINUTES``).

    ``update_or_create`` on the name: running it again changes nothing but the interval and
    function, and never resets a pending ``next_run``.
    """
    from django_q.models import Schedule

    minutes = max(1, int(conf.get("REAPER_INTERVAL_MINUTES")))
    schedule, created = Schedule.objects.update_or_create(
        name=REAPER_SCHEDULE,
        defaults={
            "func": REAPER_TASK,
            "args": None,
            "kwargs": None,
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
        },
        create_defaults={
            "func": REAPER_TASK,
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )
    return [ScheduleState(schedule.name, schedule.func, schedule.minutes, created)]
