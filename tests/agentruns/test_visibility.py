"""Ownership (docs/design.md §12.1): who sees a run, and who may cancel it.

A user sees a run they started, or every run with ``agentruns.decide_agentrun`` or
``agentruns.view_all_agentruns``; any other run does not exist for them.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from agentruns import selectors
from agentruns.exceptions import RunNotFound
from agentruns.models import AgentRunEvent, EventKind
from tests.agentruns.factories import AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
VIEW_ALL = "agentruns.view_all_agentruns"
CANCEL = "agentruns.cancel_agentrun"


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(db):
    return UserFactory(username="bob")


@pytest.fixture
def runs_of(alice, bob):
    """One run each for alice and bob, and one started by a service (no initiator)."""
    made = {
        "alice": AgentRunFactory(initiator=alice, waiting=True),
        "bob": AgentRunFactory(initiator=bob, waiting=True),
        "service": AgentRunFactory(waiting=True),
    }
    for run in made.values():
        AgentRunEvent.objects.create(run=run, sequence=0, kind=EventKind.LEASE)
    return made


# --- Who sees what --------------------------------------------------------------------------------


def test_a_user_sees_only_the_runs_they_started(alice, runs_of):
    assert list(selectors.visible_runs(user=alice)) == [runs_of["alice"]]
    assert selectors.run_visible_to(user=alice, run=runs_of["alice"])
    assert not selectors.run_visible_to(user=alice, run=runs_of["bob"])
    assert not selectors.run_visible_to(user=alice, run=runs_of["service"])
    assert {e.run_id for e in selectors.visible_events(user=alice)} == {runs_of["alice"].pk}


@pytest.mark.parametrize(
    "fields",
    [
        {"permissions": [DECIDE]},
        {"permissions": [VIEW_ALL]},
        {"is_superuser": True},
    ],
    ids=["decide", "view_all", "superuser"],
)
def test_deciders_viewers_and_superusers_see_every_run(runs_of, fields):
    staff = UserFactory(username="staff", **fields)
    assert selectors.visible_runs(user=staff).count() == 3
    assert all(selectors.run_visible_to(user=staff, run=run) for run in runs_of.values())
    assert selectors.visible_events(user=staff).count() == 3


def test_the_cancel_permission_alone_shows_nothing_more(alice, runs_of):
    holder = UserFactory(username="holder", permissions=[CANCEL])
    assert selectors.visible_runs(user=holder).count() == 0


def test_anonymous_sees_nothing_and_the_server_sees_everything(runs_of):
    assert selectors.visible_runs(user=AnonymousUser()).count() == 0
    assert not selectors.run_visible_to(user=AnonymousUser(), run=runs_of["service"])
    assert selectors.visible_runs(user=None).count() == 3
    assert selectors.visible_events(user=None).count() == 3


def test_a_run_the_user_may_not_see_is_not_found(alice, runs_of):
    assert selectors.run_get(run_uuid=runs_of["alice"].uuid, user=alice) == runs_of["alice"]
    with pytest.raises(RunNotFound):
        selectors.run_get(run_uuid=runs_of["bob"].uuid, user=alice)
    assert selectors.run_get(run_uuid=runs_of["bob"].uuid, user=None) == runs_of["bob"]


def test_every_listing_applies_the_rule(alice, runs_of):
    assert [r.pk for r in selectors.run_list(user=alice)] == [runs_of["alice"].pk]
    assert [r.pk for r in selectors.recent_runs(user=alice)] == [runs_of["alice"].pk]
    assert [r.pk for r in selectors.inbox_runs(user=alice)] == [runs_of["alice"].pk]
    assert selectors.inbox_counts(user=alice) == {"approval": 1, "input": 0, "reconciliation": 0}
