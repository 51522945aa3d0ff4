"""The move of ``use_playground`` from ``agentruns`` to ``playground`` keeps every grant."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.agentruns.factories import UserFactory

BEFORE = [("agentruns", "0002_mcpserver"), ("playground", "0001_initial")]
DECLARED = ("playground", "0002_note_use_playground")  # just before the data migration


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)  # a fresh graph: it reflects what was applied
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def permission(app_label: str, model: str) -> Permission | None:
    return Permission.objects.filter(
        content_type__app_label=app_label, content_type__model=model, codename="use_playground"
    ).first()


def old_permission() -> Permission:
    found = permission("agentruns", "agentrun")
    if found is not None:
        return found
    content_type = ContentType.objects.get_by_natural_key("agentruns", "agentrun")
    return Permission.objects.create(
        content_type=content_type, codename="use_playground", name="Can use the tool playground"
    )


def has(user_pk: int, dotted: str) -> bool:
    return get_user_model().objects.get(pk=user_pk).has_perm(dotted)  # a fresh permission cache


@pytest.fixture
def at_latest_afterwards() -> Iterator[None]:
    yield
    migrate(latest())
    ContentType.objects.clear_cache()


@pytest.mark.django_db(transaction=True)
def test_the_move_copies_every_user_and_group_grant_and_is_reversible(
    at_latest_afterwards: None,
) -> None:
    migrate(BEFORE)
    ContentType.objects.clear_cache()
    old = old_permission()
    player = UserFactory(username="player")
    player.user_permissions.add(old)
    member = UserFactory(username="member")
    players = Group.objects.create(name="players")
    players.permissions.add(old)
    member.groups.add(players)
    bystander = UserFactory(username="bystander")
    assert has(player.pk, "agentruns.use_playground")

    migrate(latest())

    new = permission("playground", "note")
    assert new is not None and new.name == "Can use the tool playground"
    assert set(new.user_set.all()) == {player}
    assert set(new.group_set.all()) == {players}
    assert has(player.pk, "playground.use_playground")
    assert has(member.pk, "playground.use_playground")
    assert not has(bystander.pk, "playground.use_playground")
    assert permission("agentruns", "agentrun") is None  # declared by no model any more

    migrate([DECLARED])  # back: the grants return

    restored = permission("agentruns", "agentrun")
    assert restored is not None
    assert set(restored.user_set.all()) == {player}
    assert set(restored.group_set.all()) == {players}
    assert has(member.pk, "agentruns.use_playground")


@pytest.mark.django_db(transaction=True)
def test_with_nothing_to_copy_the_move_writes_nothing(at_latest_afterwards: None) -> None:
    migrate([DECLARED])
    old = permission("agentruns", "agentrun")
    if old is not None:
        old.delete()
    before = Permission.objects.count()
    migrate(latest())
    assert Permission.objects.count() == before


BEFORE_START = [
    ("agentruns", "0020_spend_holds"),
    ("playground", "0005_note_idempotency_key"),
]


@pytest.mark.django_db(transaction=True)
def test_who_could_use_the_playground_may_still_start_runs_there(
    at_latest_afterwards: None,
) -> None:
    """Starting a run needs ``agentruns.start_agentrun`` from agentruns 0021 on; playground 0006
    gives it to every user and group that held ``playground.use_playground``, nobody else."""
    migrate(BEFORE_START)
    ContentType.objects.clear_cache()
    Permission.objects.filter(codename="start_agentrun").delete()  # as before 0021
    use = permission("playground", "note")
    assert use is not None
    player = UserFactory(username="player")
    player.user_permissions.add(use)
    players = Group.objects.create(name="players")
    players.permissions.add(use)
    member = UserFactory(username="member")
    member.groups.add(players)
    bystander = UserFactory(username="bystander", is_staff=True)

    migrate(latest())

    assert has(player.pk, "agentruns.start_agentrun")
    assert has(member.pk, "agentruns.start_agentrun")
    assert not has(bystander.pk, "agentruns.start_agentrun")
    start = Permission.objects.get(content_type__app_label="agentruns", codename="start_agentrun")
    assert start.name == "Can start agent runs (the API, the playground)"
