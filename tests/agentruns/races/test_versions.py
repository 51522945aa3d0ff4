"""Numbering configuration versions under concurrency (``services.versions``), with real threads
on PostgreSQL: two writers never get the same number, none is lost, and the same content
written at once is one version."""

from __future__ import annotations

import pytest
from django.db import transaction

from agentruns.models import AgentConfiguration, ConfigurationVersion
from agentruns.services.versions import configuration_version_record
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RACERS = 6
ROUNDS = 5


def _record(slug: str, prompt: str) -> int:
    """One writer: its own copy of the row with ``prompt``, recorded in its own transaction."""
    with transaction.atomic():
        configuration = AgentConfiguration.objects.get(slug=slug)
        configuration.system_prompt = prompt
        return configuration_version_record(configuration=configuration).number


def _save(slug: str, prompt: str) -> None:
    configuration = AgentConfiguration.objects.get(slug=slug)
    configuration.system_prompt = prompt
    configuration.save()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_concurrent_new_content_gets_distinct_numbers(round_):
    slug = f"race-{round_}"
    AgentConfigurationFactory(slug=slug)
    outcomes = race([lambda i=i: _record(slug, f"prompt {i}") for i in range(RACERS)])
    assert [o.error for o in outcomes] == [None] * RACERS
    got = sorted(o.value for o in outcomes)
    assert got == list(range(2, RACERS + 2))
    stored = ConfigurationVersion.objects.filter(configuration__slug=slug)
    assert sorted(stored.values_list("number", flat=True)) == list(range(1, RACERS + 2))
    assert len({v.content_hash for v in stored}) == RACERS + 1


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_concurrent_saves_of_the_same_content_make_one_version(round_):
    slug = f"same-{round_}"
    AgentConfigurationFactory(slug=slug)
    outcomes = race([lambda: _record(slug, "the same prompt") for _ in range(RACERS)])
    assert [o.error for o in outcomes] == [None] * RACERS
    assert {o.value for o in outcomes} == {2}
    assert ConfigurationVersion.objects.filter(configuration__slug=slug).count() == 2


def test_concurrent_admin_style_saves_each_make_their_own_version():
    AgentConfigurationFactory(slug="saves")
    outcomes = race([lambda i=i: _save("saves", f"saved {i}") for i in range(RACERS)])
    assert [o.error for o in outcomes] == [None] * RACERS
    numbers = ConfigurationVersion.objects.filter(configuration__slug="saves").values_list(
        "number", flat=True
    )
    assert sorted(numbers) == list(range(1, RACERS + 2))
