"""The django-q2 schedules Leasehold needs, created or updated idempotently.

Two clusters racing never enqueue one schedule twice (django-q2's scheduler locks due rows), and
the reaper tolerates overlapping with itself anyway (docs/design.md §8.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from agentruns.conf import app_settings

REAPER_SCHEDULE = "agentruns: reap stale runs"
REAPER_TASK = "agentruns.tasks.reap_stale_runs"
RETENTION_SCHEDULE = "agentruns: purge old runs"
RETENTION_TASK = "agentruns.tasks.purge_old_runs"
NOTIFY_SCHEDULE = "agentruns: notify waiting runs"
NOTIFY_TASK = "agentruns.tasks.notify_waiting"
RUN_SCHEDULES_SCHEDULE = "agentruns: start scheduled runs"
RUN_SCHEDULES_TASK = "agentruns.tasks.start_scheduled_runs"


@dataclass(frozen=True)
class ScheduleState:
    name: str
    func: str
    minutes: int
    created: bool
    removed: bool = False
    # Why a removed schedule was removed (the switch that is off).
    reason: str = ""


def schedules_setup() -> list[ScheduleState]:
    """Create or update the reaper's ``Schedule`` (every ``REAPER_INTERVAL_MINUTES``), the
    daily retention purge when ``RETENTION_DAYS`` is above 0 (removed when it is 0), and the
    notification pass every minute when ``NOTIFY_INTERVAL`` is above 0 (removed when it is 0),
    and the pass over run schedules (``RunSchedule``) every minute.

    ``update_or_create`` on the name: running it again changes nothing but the interval and
    function, and never resets a pending ``next_run``.
    """
    from django_q.models import Schedule

    states = [_ensure(REAPER_SCHEDULE, REAPER_TASK, app_settings().reaper_interval_minutes)]
    if app_settings().retention_days > 0:
        states.append(_ensure(RETENTION_SCHEDULE, RETENTION_TASK, 24 * 60))
    else:
        removed, _ = Schedule.objects.filter(name=RETENTION_SCHEDULE).delete()
        if removed:
            states.append(
                ScheduleState(
                    RETENTION_SCHEDULE, RETENTION_TASK, 0, False, True, "retention is off"
                )
            )
    if app_settings().notify_interval > 0:
        states.append(_ensure(NOTIFY_SCHEDULE, NOTIFY_TASK, 1))
    else:
        removed, _ = Schedule.objects.filter(name=NOTIFY_SCHEDULE).delete()
        if removed:
            states.append(
                ScheduleState(NOTIFY_SCHEDULE, NOTIFY_TASK, 0, False, True, "notifications are off")
            )
    states.append(_ensure(RUN_SCHEDULES_SCHEDULE, RUN_SCHEDULES_TASK, 1))
    return states


def _ensure(name: str, func: str, minutes: int) -> ScheduleState:
    from django_q.models import Schedule

    schedule, created = Schedule.objects.update_or_create(
        name=name,
        defaults={
            "func": func,
            "args": None,
            "kwargs": None,
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
        },
        create_defaults={
            "func": func,
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )
    return ScheduleState(schedule.name, schedule.func, schedule.minutes or minutes, created)
