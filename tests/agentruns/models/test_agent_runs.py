"""The run models' own guarantees: unique ``(run, sequence)``, protected configurations."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_second_writer_of_an_existing_run_sequence_fails():
    run = AgentRunFactory(running=True)
    AgentRunEvent.objects.create(run=run, sequence=3, kind=EventKind.LLM, segment="old")

    with pytest.raises(IntegrityError), transaction.atomic():
        AgentRunEvent.objects.create(run=run, sequence=3, kind=EventKind.TOOL, segment="new")

    assert list(AgentRunEvent.objects.filter(run=run).values_list("sequence", "segment")) == [
        (3, "old")
    ]


def test_same_sequence_on_different_runs_is_fine():
    first, second = AgentRunFactory(), AgentRunFactory()
    AgentRunEvent.objects.create(run=first, sequence=0, kind=EventKind.LEASE)
    AgentRunEvent.objects.create(run=second, sequence=0, kind=EventKind.LEASE)

    assert AgentRunEvent.objects.filter(sequence=0).count() == 2


def test_bulk_insert_with_a_taken_sequence_inserts_nothing():
    run = AgentRunFactory(running=True)
    AgentRunEvent.objects.create(run=run, sequence=1, kind=EventKind.LLM)

    with pytest.raises(IntegrityError), transaction.atomic():
        AgentRunEvent.objects.bulk_create(
            [AgentRunEvent(run=run, sequence=n, kind=EventKind.TOOL) for n in (0, 1, 2)]
        )

    assert list(AgentRunEvent.objects.filter(run=run).values_list("sequence", flat=True)) == [1]


def test_run_uuid_is_unique():
    run = AgentRunFactory()

    with pytest.raises(IntegrityError), transaction.atomic():
        AgentRunFactory(uuid=run.uuid)


def test_configuration_with_runs_cannot_be_deleted():
    run = AgentRunFactory()

    with pytest.raises(ProtectedError):
        run.configuration.delete()

    assert AgentRun.objects.filter(pk=run.pk).exists()


def test_an_approver_group_named_by_a_configuration_cannot_be_deleted():
    """Deleting the group must not silently lift the restriction (fail closed)."""
    group = Group.objects.create(name="webhook approvers")
    config = AgentConfigurationFactory(approver_group=group)

    with pytest.raises(ProtectedError):
        group.delete()

    config.refresh_from_db()
    assert config.approver_group == group
    assert AgentConfigurationFactory().approver_group is None


@pytest.mark.parametrize(
    ("app_label", "codename"),
    [
        ("agentruns", "decide_agentrun"),
        ("agentruns", "view_all_agentruns"),
        ("agentruns", "cancel_agentrun"),
        ("playground", "use_playground"),
        ("playground", "approve_webhooks"),
    ],
)
def test_the_permissions_exist(app_label, codename):
    assert Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists()


def test_events_go_with_their_run():
    run = AgentRunFactory(completed=True)
    AgentRunEvent.objects.create(run=run, sequence=0, kind=EventKind.LEASE)

    run.delete()

    assert not AgentRunEvent.objects.exists()


def test_counters_refuse_negative_values():
    run = AgentRunFactory()

    with pytest.raises(IntegrityError), transaction.atomic():
        AgentRun.objects.filter(pk=run.pk).update(requeue_count=-1)

    run.refresh_from_db()
    assert run.requeue_count == 0


@pytest.mark.parametrize(
    ("status", "terminal"),
    [
        (Status.QUEUED, False),
        (Status.RUNNING, False),
        (Status.WAITING_FOR_APPROVAL, False),
        (Status.WAITING_FOR_INPUT, False),
        (Status.WAITING_FOR_RECONCILIATION, False),
        (Status.COMPLETED, True),
        (Status.FAILED, True),
        (Status.CANCELLED, True),
    ],
)
def test_is_terminal(status, terminal):
    assert AgentRun(status=status).is_terminal is terminal


def test_factory_traits_make_the_states_they_name():
    config = AgentConfigurationFactory()

    assert AgentRunFactory(configuration=config).status == Status.QUEUED
    assert AgentRunFactory(configuration=config, running=True).claimed_by
    assert AgentRunFactory(configuration=config, stale=True).status == Status.RUNNING
    assert AgentRunFactory(configuration=config, waiting=True).pending_turn["turn_digest"]
    assert AgentRunFactory(configuration=config, in_doubt=True).pending_effect
    assert AgentRunFactory(configuration=config, cancelled=True).is_terminal


def test_user_factory_sets_a_usable_password_and_permissions():
    user = UserFactory(permissions=["agentruns.decide_agentrun"])

    user = type(user).objects.get(pk=user.pk)
    assert user.check_password("pw")
    assert user.has_perm("agentruns.decide_agentrun")
