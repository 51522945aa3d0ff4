"""Due times of run schedules: cron and interval, missed ticks, bad timings refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentruns import schedule_times as times


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 3, 2, hour, minute, second, tzinfo=UTC)  # a Monday


HOURLY = {"kind": "interval", "cron": "", "interval_seconds": 3600, "time_zone": "UTC"}
WEEKDAYS_9 = {"kind": "cron", "cron": "0 9 * * 1-5", "interval_seconds": None, "time_zone": "UTC"}


def test_an_interval_is_not_due_before_its_time():
    assert times.latest_due(next_due=at(10), now=at(9, 59), **HOURLY) is None


def test_three_missed_intervals_are_one_due_time_the_latest():
    # Due at 10:00; no worker looked until 13:30: 10, 11, 12 and 13 o'clock were missed.
    assert times.latest_due(next_due=at(10), now=at(13, 30), **HOURLY) == at(13)
    assert times.first_due(after=at(13), **HOURLY) == at(14)


def test_every_moment_within_one_interval_names_the_same_due_time():
    seen = {times.latest_due(next_due=at(10), now=at(11, m), **HOURLY) for m in range(60)}
    assert seen == {at(11)}


def test_a_cron_schedule_is_due_at_its_minute_and_the_next_is_the_next_weekday():
    assert times.first_due(after=at(8), **WEEKDAYS_9) == at(9)
    assert times.latest_due(next_due=at(9), now=at(9), **WEEKDAYS_9) == at(9)
    friday = datetime(2026, 3, 6, 9, tzinfo=UTC)
    assert times.first_due(after=friday, **WEEKDAYS_9) == friday + timedelta(days=3)


def test_missed_cron_ticks_are_one_due_time_the_latest():
    every_15 = {**WEEKDAYS_9, "cron": "*/15 * * * *"}
    assert times.latest_due(next_due=at(9), now=at(10, 7), **every_15) == at(10)


def test_a_cron_expression_is_read_in_its_time_zone():
    paris = {**WEEKDAYS_9, "time_zone": "Europe/Paris"}
    assert times.first_due(after=at(0), **paris) == at(8)  # 09:00 in Paris in March (UTC+1)


@pytest.mark.parametrize(
    "expression",
    ["", "* * * *", "61 * * * *", "0 9 * * mon-xyz", "0 9 * * * *", "@reboot", "\x00 * * * *"],
)
def test_a_bad_cron_expression_is_refused_with_a_reason(expression):
    problem = times.cron_problem(expression)
    assert problem is not None and "cron expression" in problem


def test_a_bad_time_zone_is_refused():
    assert "time zone" in times.cron_problem("0 9 * * *", "Mars/Olympus")
    assert times.cron_problem("0 9 * * 1-5", "Europe/Paris") is None


@pytest.mark.parametrize("seconds", [None, 0, 59, times.MAX_INTERVAL_SECONDS + 1])
def test_an_interval_outside_its_bounds_is_refused(seconds):
    assert times.interval_problem(seconds) is not None
