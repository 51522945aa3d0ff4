"""When a run schedule is due: cron expressions (``croniter``) and fixed intervals.

Owns the arithmetic of ``RunSchedule`` times: whether a timing is valid, the first due time
after a moment, and the latest due time not after now (so ticks missed while no worker ran start
one run, for the latest of them, never one per missed tick). Pure functions of their arguments;
never reads or writes the database.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypedDict
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, croniter

#: The shortest interval: the driver ticks once a minute (``setup_schedules``).
MIN_INTERVAL_SECONDS = 60
#: The longest interval: a year and a day.
MAX_INTERVAL_SECONDS = 366 * 24 * 3600
CRON = "cron"
INTERVAL = "interval"


class Timing(TypedDict):
    """A schedule's timing, as ``RunSchedule.timing`` gives it."""

    kind: str
    cron: str
    interval_seconds: int | None
    time_zone: str


_CRON_ERRORS = (CroniterBadCronError, CroniterBadDateError, CroniterNotAlphaError, ValueError)


def cron_problem(expression: str, time_zone: str = "UTC") -> str | None:
    """Why ``expression`` (five fields: minute hour day month weekday) in ``time_zone`` cannot
    drive a schedule, or None when it can."""
    zone_problem = time_zone_problem(time_zone)
    if zone_problem is not None:
        return zone_problem
    if not isinstance(expression, str) or len(expression.split()) != 5:
        return (
            f"{expression!r} is not a cron expression of five fields "
            "(minute hour day-of-month month day-of-week, e.g. '0 9 * * 1-5')"
        )
    try:
        croniter(expression, datetime.now(ZoneInfo(time_zone))).get_next(datetime)
    except _CRON_ERRORS as exc:
        return f"{expression!r} is not a valid cron expression: {exc}"
    return None


def time_zone_problem(time_zone: str) -> str | None:
    """Why ``time_zone`` is not an IANA zone name, or None."""
    try:
        ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        return f"{time_zone!r} is not a time zone name (e.g. UTC, Europe/Paris)"
    return None


def interval_problem(seconds: int | None) -> str | None:
    """Why ``seconds`` cannot be a schedule's interval, or None."""
    if seconds is None or not MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        return (
            f"An interval is {MIN_INTERVAL_SECONDS} to {MAX_INTERVAL_SECONDS} seconds "
            "(the schedules are looked at once a minute)."
        )
    return None


def timing_problem(
    *, kind: str, cron: str, interval_seconds: int | None, time_zone: str
) -> str | None:
    """Why this timing (a ``RunSchedule``'s) cannot be followed, or None."""
    if kind == CRON:
        return cron_problem(cron, time_zone)
    if kind == INTERVAL:
        return interval_problem(interval_seconds)
    return f"{kind!r} is neither cron nor interval"


def first_due(
    *, kind: str, cron: str, interval_seconds: int | None, time_zone: str, after: datetime
) -> datetime:
    """The first due time strictly after ``after`` (an interval: ``after`` plus one interval)."""
    if kind == INTERVAL:
        assert interval_seconds is not None
        return after + timedelta(seconds=interval_seconds)
    return _cron(cron, time_zone, after).get_next(datetime)


def latest_due(
    *,
    kind: str,
    cron: str,
    interval_seconds: int | None,
    time_zone: str,
    next_due: datetime,
    now: datetime,
) -> datetime | None:
    """The latest due time at or before ``now``, counting from ``next_due`` (the schedule's
    pending due time); None when ``next_due`` is still ahead. Deterministic for every ``now``
    before the following due time, so two workers looking in the same interval agree."""
    if next_due > now:
        return None
    if kind == INTERVAL:
        assert interval_seconds is not None
        step = timedelta(seconds=interval_seconds)
        return next_due + step * ((now - next_due) // step)
    previous = _cron(cron, time_zone, now).get_prev(datetime)
    return max(next_due, previous)


def _cron(expression: str, time_zone: str, start: datetime) -> croniter:
    return croniter(expression, start.astimezone(ZoneInfo(time_zone)))
