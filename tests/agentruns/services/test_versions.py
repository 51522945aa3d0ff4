"""``services.versions``: a version per change of a pinned setting, numbered 1, 2, 3… per
configuration, none for an unchanged save or a change of what stays live."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from agentruns import versions
from agentruns.models import AgentConfiguration, AgentRun, ConfigurationVersion
from agentruns.services.versions import configuration_version_record
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory

pytestmark = pytest.mark.django_db


def numbers(configuration: AgentConfiguration) -> list[int]:
    return sorted(configuration.versions.values_list("number", flat=True))


def test_a_new_configuration_has_version_1_and_an_unchanged_save_makes_none():
    configuration = AgentConfigurationFactory()
    assert numbers(configuration) == [1]
    configuration.save()
    AgentConfiguration.objects.get(pk=configuration.pk).save()  # as read back: same content
    assert numbers(configuration) == [1]


def test_each_change_of_a_pinned_setting_makes_the_next_number():
    configuration = AgentConfigurationFactory()
    configuration.system_prompt = "one"
    configuration.save()
    configuration.price_per_million_prompt_tokens = Decimal("1.5")
    configuration.save()
    configuration.approval_timeout = timedelta(minutes=30)
    configuration.save()
    assert numbers(configuration) == [1, 2, 3, 4]
    latest = configuration.versions.order_by("-number").first()
    values = versions.parse_snapshot(latest.snapshot)
    assert values["price_per_million_prompt_tokens"] == Decimal("1.5")
    assert values["approval_timeout"] == timedelta(minutes=30)
    assert values["system_prompt"] == "one"


def test_what_stays_live_makes_no_version():
    configuration = AgentConfigurationFactory()
    configuration.name = "renamed"
    configuration.is_active = False
    configuration.daily_budget = Decimal("10")
    configuration.notify_webhook_url = ""
    configuration.save()
    configuration.save(update_fields=["is_active"])
    assert numbers(configuration) == [1]


def test_a_decimal_typed_with_fewer_places_hashes_as_stored():
    configuration = AgentConfigurationFactory(price_per_million_prompt_tokens=Decimal("2.5"))
    again = AgentConfiguration.objects.get(pk=configuration.pk)
    assert again.price_per_million_prompt_tokens == Decimal("2.500000")
    assert configuration_version_record(configuration=again).number == 1


def test_going_back_to_earlier_content_is_a_new_number():
    configuration = AgentConfigurationFactory(system_prompt="a")
    configuration.system_prompt = "b"
    configuration.save()
    configuration.system_prompt = "a"
    configuration.save()
    assert numbers(configuration) == [1, 2, 3]


def test_an_edit_by_queryset_update_is_versioned_when_the_next_run_starts():
    """``update()`` skips ``save``: the run inserted next pins a version of what it read."""
    configuration = AgentConfigurationFactory(system_prompt="a")
    AgentConfiguration.objects.filter(pk=configuration.pk).update(system_prompt="b")
    run = AgentRunFactory(configuration=AgentConfiguration.objects.get(pk=configuration.pk))
    assert run.config_version.number == 2
    assert versions.parse_snapshot(run.config_version.snapshot)["system_prompt"] == "b"


def test_bulk_inserted_runs_are_pinned_too():
    configuration = AgentConfigurationFactory()
    made = AgentRun.objects.bulk_create(
        [AgentRun(configuration=configuration, prompt=f"p{i}", status="queued") for i in range(3)]
    )
    assert {run.config_version_id for run in made} == {configuration.versions.get().pk}


def test_a_pinned_view_is_never_saved_nor_versioned():
    run = AgentRunFactory()
    view = versions.pinned_configuration(run)
    with pytest.raises(RuntimeError):
        view.save()
    with pytest.raises(ValueError):
        configuration_version_record(configuration=view)
    assert ConfigurationVersion.objects.filter(configuration=run.configuration).count() == 1


def test_the_admin_names_the_author_and_a_version_cannot_be_deleted_under_a_run(admin_client):
    from django.db.models import ProtectedError
    from django.urls import reverse

    configuration = AgentConfigurationFactory(slug="authored", name="Authored")
    url = reverse("admin:agentruns_agentconfiguration_change", args=[configuration.pk])
    fields = {
        "slug": "authored",
        "name": "Authored",
        "provider": "scripted",
        "timeout_seconds": 30,
        "tools": "[]",
        "max_iterations": 10,
        "script": "[]",
        "is_active": "on",
        "on_approval_timeout": "deny",
        "system_prompt": "edited in the admin",
    }
    assert admin_client.post(url, fields).status_code == 302
    latest = configuration.versions.order_by("-number").first()
    assert latest.number == 2 and latest.created_by.username == "admin"
    run = AgentRunFactory(configuration=AgentConfiguration.objects.get(pk=configuration.pk))
    with pytest.raises(ProtectedError):
        run.config_version.delete()


def test_a_start_that_died_after_its_version_leaves_the_version_the_next_run_pins():
    """The gap of an insert outside a transaction (``run_enqueue``): the version is committed,
    the process dies before the run's INSERT. Nothing is half-made: the next start pins that
    same version (idempotent on content), and no number is skipped."""
    configuration = AgentConfigurationFactory(system_prompt="a")
    AgentConfiguration.objects.filter(pk=configuration.pk).update(system_prompt="b")
    fresh = AgentConfiguration.objects.get(pk=configuration.pk)
    orphan = configuration_version_record(configuration=fresh)  # … and the process died here
    assert not orphan.runs.exists()
    from agentruns.services import runs

    queued = runs.run_enqueue(configuration=fresh, prompt="again")
    assert queued.config_version_id == orphan.pk
    assert numbers(configuration) == [1, 2]


def test_a_run_inserted_with_another_runs_pinned_view_pins_that_version():
    first = AgentRunFactory()
    first.configuration.system_prompt = "edited"
    first.configuration.save()
    view = versions.pinned_configuration(AgentRun.objects.get(pk=first.pk))
    second = AgentRunFactory(configuration=view)
    assert second.config_version_id == first.config_version_id
    assert numbers(first.configuration) == [1, 2]
