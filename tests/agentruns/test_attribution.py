"""Approval attribution (docs/design.md §5.6): the classification, the ranking, and the selector
that computes it for a whole page of runs in one query."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns import selectors
from agentruns.attribution import Attribution, attribute_runs, classify, strongest
from agentruns.models import AgentRunEvent, EventKind
from tests.agentruns.factories import AgentRunFactory, UserFactory


@pytest.mark.parametrize(
    "initiator_id, decider_id, expected",
    [
        (1, 1, Attribution.SELF),
        (1, 2, Attribution.SECOND_PERSON),
        (None, 2, Attribution.INITIATOR_UNKNOWN),
        (1, None, Attribution.UNRESOLVED),
        (None, None, Attribution.UNRESOLVED),
    ],
)
def test_classify(initiator_id, decider_id, expected):
    assert classify(initiator_id=initiator_id, decider_id=decider_id) == expected


def test_the_strongest_wins_self_unresolved_initiator_unknown_second_person():
    order = [
        Attribution.SELF,
        Attribution.UNRESOLVED,
        Attribution.INITIATOR_UNKNOWN,
        Attribution.SECOND_PERSON,
    ]
    for position, expected in enumerate(order):
        weaker = order[position:]
        assert strongest(reversed(weaker)) == expected
        assert strongest(weaker) == expected
    assert strongest([]) is None


def test_attribute_runs_ranks_per_run():
    result = attribute_runs(
        initiators={10: 1, 11: 1, 12: None},
        deciders={10: [2, 1, 2], 11: [2, None], 12: []},
    )
    assert result == {10: Attribution.SELF, 11: Attribution.UNRESOLVED, 12: None}


def approve(run, actor, approved=True):
    sequence = AgentRunEvent.objects.filter(run=run).count()
    AgentRunEvent.objects.create(
        run=run,
        sequence=sequence,
        kind=EventKind.APPROVAL,
        payload={"approved": approved},
        actor=actor,
    )


@pytest.mark.django_db
def test_run_attributions_over_real_events():
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    gone = UserFactory(username="gone")
    own = AgentRunFactory(completed=True, initiator=alice)
    approve(own, bob)
    approve(own, alice)  # a second fence, self-approved: self wins
    other = AgentRunFactory(completed=True, initiator=alice)
    approve(other, bob)
    approve(other, alice, approved=False)  # a denial approves nothing
    service = AgentRunFactory(completed=True, initiator=None)
    approve(service, bob)
    orphan = AgentRunFactory(completed=True, initiator=alice)
    approve(orphan, gone)
    approve(orphan, bob)
    gone.delete()  # the event keeps no decider: unresolved outranks second_person
    untouched = AgentRunFactory(completed=True, initiator=alice)

    result = selectors.run_attributions(runs=[own, other, service, orphan, untouched])
    assert result == {
        own.pk: Attribution.SELF,
        other.pk: Attribution.SECOND_PERSON,
        service.pk: Attribution.INITIATOR_UNKNOWN,
        orphan.pk: Attribution.UNRESOLVED,
        untouched.pk: None,
    }


@pytest.mark.django_db
def test_run_attributions_costs_one_query_for_any_number_of_runs():
    alice = UserFactory(username="alice")
    few = [AgentRunFactory(completed=True, initiator=alice) for _ in range(2)]
    many = few + [AgentRunFactory(completed=True, initiator=alice) for _ in range(30)]
    for run in many:
        approve(run, alice)
    for runs in (few, many):
        with CaptureQueriesContext(connection) as queries:
            result = selectors.run_attributions(runs=runs)
        assert len(queries.captured_queries) == 1
        assert set(result.values()) == {Attribution.SELF}
    assert selectors.run_attributions(runs=[]) == {}
