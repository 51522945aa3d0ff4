"""The models of schedules and event sources refuse what could never run."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agentruns.models import EventSource, RunSchedule
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

pytestmark = pytest.mark.django_db


def errors_of(instance) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as refused:
        instance.full_clean()
    return refused.value.message_dict


def a_schedule(**fields) -> RunSchedule:
    values = {"name": "n", "kind": "cron", "cron": "0 9 * * 1-5", "prompt": "go", **fields}
    return RunSchedule(configuration=AgentConfigurationFactory(), initiator=UserFactory(), **values)


def test_a_valid_cron_schedule_cleans():
    a_schedule().full_clean()


def test_a_bad_cron_expression_is_refused_at_save_with_a_clear_error():
    assert "cron expression" in errors_of(a_schedule(cron="every monday"))["cron"][0]


def test_a_bad_time_zone_names_its_field():
    assert "time zone" in errors_of(a_schedule(time_zone="Nowhere/Else"))["time_zone"][0]


def test_an_interval_schedule_needs_its_interval():
    errors = errors_of(a_schedule(kind="interval", cron="", interval_seconds=None))
    assert "interval_seconds" in errors


def test_a_schedule_needs_a_prompt():
    assert "prompt" in errors_of(a_schedule(prompt="  "))


@pytest.mark.parametrize("name", ["DJANGO_SECRET_KEY", "DATABASE_URL", "LEASEHOLD-X", ""])
def test_an_event_secret_must_be_a_leasehold_variable(name):
    source = EventSource(
        configuration=AgentConfigurationFactory(),
        actor=UserFactory(),
        secret_env=name,
        prompt="p",
    )
    assert "secret_env" in errors_of(source)
