"""The migration ``0031_configuration_versions``: version 1 of every existing configuration, every
existing run pinned to it, on SQLite and PostgreSQL alike (run this module with each)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection

from agentruns import versions
from agentruns.models import AgentRun, ConfigurationVersion
from agentruns.services import runs

BEFORE = ("agentruns", "0030_standing_approvals")  # the migration before this one
AFTER = ("agentruns", "0031_configuration_versions")


def migrate(targets: list[tuple[str, str]]) -> None:
    from django.db.migrations.executor import MigrationExecutor

    MigrationExecutor(connection).migrate(targets)


def latest() -> list[tuple[str, str]]:
    from django.db.migrations.executor import MigrationExecutor

    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.fixture
def at_latest_afterwards():
    yield
    migrate(latest())


@pytest.mark.django_db(transaction=True)
def test_the_migration_makes_version_1_and_pins_existing_runs(at_latest_afterwards):
    from django.db.migrations.executor import MigrationExecutor

    migrate([BEFORE])
    old = MigrationExecutor(connection).loader.project_state([BEFORE]).apps
    Configuration = old.get_model("agentruns", "AgentConfiguration")
    Run = old.get_model("agentruns", "AgentRun")
    priced = Configuration.objects.create(
        slug="old",
        name="old",
        system_prompt="an old prompt",
        tools=["list_notes"],
        script=[{"content": "old answer"}],
        price_per_million_prompt_tokens=Decimal("1.5"),
    )
    bare = Configuration.objects.create(slug="bare", name="bare", script=[{"content": "x"}])
    for status in ("completed", "queued"):
        Run.objects.create(configuration=priced, prompt="p", status=status)

    migrate(latest())

    version = ConfigurationVersion.objects.get(configuration_id=priced.pk)
    assert version.number == 1
    values = versions.parse_snapshot(version.snapshot)
    assert values["system_prompt"] == "an old prompt" and values["tools"] == ["list_notes"]
    assert values["price_per_million_prompt_tokens"] == Decimal("1.5")
    assert set(AgentRun.objects.values_list("config_version_id", flat=True)) == {version.pk}
    assert ConfigurationVersion.objects.get(configuration_id=bare.pk).number == 1
    # The hash is the one the service computes: an unchanged configuration makes no version 2.
    run = runs.run_start_sync(configuration="old", prompt="after").run
    assert run.config_version_id == version.pk and run.output == "old answer"
