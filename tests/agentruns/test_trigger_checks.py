"""The database checks of schedules and event sources (``agentruns.E060``, ``agentruns.E061``)."""

from __future__ import annotations

import pytest
from django.core import checks

from agentruns.models import EventSource, RunSchedule
from tests.agentruns.support.triggers import event_source, schedule

pytestmark = pytest.mark.django_db


def ids() -> list[str]:
    return [m.id for m in checks.run_checks(tags=[checks.Tags.database], databases=["default"])]


def test_nothing_to_report_on_valid_rows():
    schedule()
    event_source()
    assert not {"agentruns.E060", "agentruns.E061"} & set(ids())


def test_rows_written_around_validation_are_reported():
    EventSource.objects.filter(pk=event_source().pk).update(secret_env="DJANGO_SECRET_KEY")
    RunSchedule.objects.filter(pk=schedule().pk).update(kind="cron", cron="nope")
    assert {"agentruns.E060", "agentruns.E061"} <= set(ids())


def test_without_a_database_the_check_reads_nothing():
    assert checks.run_checks(tags=[checks.Tags.database]) == []
