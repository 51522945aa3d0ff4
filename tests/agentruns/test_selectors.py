"""Ownership (docs/design.md §12.1): who sees a run, and who may cancel it.

A user sees a run they started, or every run with ``agentruns.decide_agentrun`` or
``agentruns.view_all_agentruns``; any other run does not exist for them. The initiator may
cancel their own run; anyone else needs ``agentruns.cancel_agentrun``; a run in doubt also needs
``agentruns.decide_agentrun`` (what abandoning it needs).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from agentruns import selectors, transitions
from agentruns.exceptions import NotPermitted, RunNotFound
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import runs
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
    # An event inserted by hand: the run's counter follows it, as a writer's would.
    AgentRun.objects.filter(pk__in=[r.pk for r in made.values()]).update(next_sequence=1)
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


# --- Cancel ---------------------------------------------------------------------------------------


def status(run: AgentRun) -> str:
    return AgentRun.objects.get(pk=run.pk).status


def test_the_initiator_may_cancel_their_own_run_without_any_permission(alice, runs_of):
    assert runs.run_cancel(run_uuid=runs_of["alice"].uuid, actor=alice) is True
    assert status(runs_of["alice"]) == Status.CANCELLED
    assert runs.run_cancel(run_uuid=runs_of["alice"].uuid, actor=alice) is False  # ended


def test_someone_else_s_run_does_not_exist_for_a_user_who_cannot_see_it(alice, runs_of):
    with pytest.raises(RunNotFound):
        runs.run_cancel(run_uuid=runs_of["bob"].uuid, actor=alice)
    holder = UserFactory(username="holder", permissions=[CANCEL])  # may cancel, cannot see
    with pytest.raises(RunNotFound):
        runs.run_cancel(run_uuid=runs_of["bob"].uuid, actor=holder)
    assert status(runs_of["bob"]) == Status.WAITING_FOR_APPROVAL


@pytest.mark.parametrize("seer", [DECIDE, VIEW_ALL])
@pytest.mark.parametrize("victim", ["bob", "service"])
def test_cancelling_another_s_run_needs_the_cancel_permission(runs_of, seer, victim):
    watcher = UserFactory(username="watcher", permissions=[seer])
    with pytest.raises(NotPermitted) as refused:
        runs.run_cancel(run_uuid=runs_of[victim].uuid, actor=watcher)
    assert refused.value.message == (
        "cancelling a run someone else started needs agentruns.cancel_agentrun"
    )
    assert status(runs_of[victim]) == Status.WAITING_FOR_APPROVAL

    canceller = UserFactory(username="canceller", permissions=[seer, CANCEL])
    assert runs.run_cancel(run_uuid=runs_of[victim].uuid, actor=canceller) is True
    event = AgentRunEvent.objects.get(run=runs_of[victim], kind=EventKind.CANCEL)
    assert event.actor == canceller


def test_a_superuser_and_the_server_may_cancel_anything(runs_of):
    root = UserFactory(username="root", is_superuser=True)
    assert runs.run_cancel(run_uuid=runs_of["bob"].uuid, actor=root) is True
    assert runs.run_cancel(run_uuid=runs_of["service"].uuid) is True


def test_cancelling_a_run_in_doubt_also_needs_the_decide_permission(alice):
    mine = AgentRunFactory(initiator=alice, in_doubt=True)
    with pytest.raises(NotPermitted) as refused:
        runs.run_cancel(run_uuid=mine.uuid, actor=alice)
    assert refused.value.message == (
        "cancelling a run in doubt needs agentruns.decide_agentrun, as abandoning it does"
    )
    assert status(mine) == Status.WAITING_FOR_RECONCILIATION

    deciding_initiator = UserFactory(username="carol", permissions=[DECIDE])
    theirs = AgentRunFactory(initiator=deciding_initiator, in_doubt=True)
    assert runs.run_cancel(run_uuid=theirs.uuid, actor=deciding_initiator) is True


def test_another_s_run_in_doubt_needs_both_cancel_and_decide(bob):
    doubt = AgentRunFactory(initiator=bob, in_doubt=True)
    viewer = UserFactory(username="viewer", permissions=[VIEW_ALL, CANCEL])
    with pytest.raises(NotPermitted, match="decide_agentrun"):
        runs.run_cancel(run_uuid=doubt.uuid, actor=viewer)
    decider = UserFactory(username="decider", permissions=[DECIDE])
    with pytest.raises(NotPermitted, match="cancel_agentrun"):
        runs.run_cancel(run_uuid=doubt.uuid, actor=decider)
    both = UserFactory(username="both", permissions=[DECIDE, CANCEL])
    assert runs.run_cancel(run_uuid=doubt.uuid, actor=both) is True


def test_a_run_that_goes_in_doubt_after_it_was_read_is_kept_by_the_guard(alice, monkeypatch):
    """The in-doubt rule is in the cancel's WHERE: a run read as waiting that the reaper parked
    in doubt before the UPDATE is refused, not cancelled."""
    run = AgentRunFactory(initiator=alice, waiting=True)
    read = selectors.run_get(run_uuid=run.uuid, user=alice)  # read: waiting for approval
    AgentRun.objects.filter(pk=run.pk).update(status=Status.WAITING_FOR_RECONCILIATION)
    monkeypatch.setattr(selectors, "run_get", lambda **kwargs: read)

    with pytest.raises(NotPermitted, match="in doubt"):
        runs.run_cancel(run_uuid=run.uuid, actor=alice)

    assert status(run) == Status.WAITING_FOR_RECONCILIATION
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.CANCEL).exists()


def test_the_cancel_transition_can_leave_a_run_in_doubt_alone():
    doubt = AgentRunFactory(in_doubt=True)
    waiting = AgentRunFactory(waiting=True)
    assert transitions.run_cancel(run_id=doubt.pk, in_doubt=False) is False
    assert transitions.run_cancel(run_id=waiting.pk, in_doubt=False) is True
    assert transitions.run_cancel(run_id=doubt.pk) is True
    assert (status(doubt), status(waiting)) == (Status.CANCELLED, Status.CANCELLED)
