"""The admin's run and event pages show only the runs their user may see (docs/design.md §12.1):
another's run is not listed and its pages answer 404, exactly as a run that does not exist."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import AgentRunEvent, EventKind
from tests.agentruns.factories import AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db

ADMIN_VIEW = ["agentruns.view_agentrun", "agentruns.view_agentrunevent"]


@pytest.fixture
def operator(db):
    """Staff who may open the admin's run pages, but see only their own runs."""
    return UserFactory(username="operator", permissions=ADMIN_VIEW)


@pytest.fixture
def runs(operator):
    mine = AgentRunFactory(initiator=operator, completed=True, prompt="mine")
    theirs = AgentRunFactory(initiator=UserFactory(username="other"), completed=True)
    for run in (mine, theirs):
        AgentRunEvent.objects.create(run=run, sequence=0, kind=EventKind.LEASE)
    return mine, theirs


def change(model: str, pk: int) -> str:
    return reverse(f"admin:agentruns_{model}_change", args=[pk])


def test_the_run_list_shows_only_one_s_own_runs(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    html = client.get(reverse("admin:agentruns_agentrun_changelist")).content.decode()
    assert str(mine.uuid) in html and str(theirs.uuid) not in html


def test_another_s_run_page_is_404_like_a_missing_one(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    assert client.get(change("agentrun", mine.pk)).status_code == 200
    assert client.get(change("agentrun", theirs.pk)).status_code == 404
    assert client.get(change("agentrun", 999_999)).status_code == 404


def test_events_of_another_s_run_are_not_listed_and_404(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    listed = client.get(reverse("admin:agentruns_agentrunevent_changelist")).context["cl"]
    assert [e.run_id for e in listed.result_list] == [mine.pk]
    their_event = AgentRunEvent.objects.get(run=theirs)
    assert client.get(change("agentrunevent", their_event.pk)).status_code == 404
    my_event = AgentRunEvent.objects.get(run=mine)
    assert client.get(change("agentrunevent", my_event.pk)).status_code == 200


@pytest.mark.parametrize("extra", [["agentruns.view_all_agentruns"], ["agentruns.decide_agentrun"]])
def test_viewers_and_deciders_see_every_run(client, runs, extra):
    _, theirs = runs
    client.force_login(UserFactory(username="watcher", permissions=ADMIN_VIEW + extra))
    assert client.get(change("agentrun", theirs.pk)).status_code == 200
    listed = client.get(reverse("admin:agentruns_agentrun_changelist")).context["cl"]
    assert listed.result_count == 2


def test_an_event_s_payload_is_shown_as_indented_json_with_real_line_breaks(client, operator):
    run = AgentRunFactory(initiator=operator)
    event = AgentRunEvent.objects.create(
        run=run, sequence=0, kind=EventKind.TOOL, payload={"name": "create_note", "ok": True}
    )
    client.force_login(operator)
    html = client.get(reverse("admin:agentruns_agentrunevent_change", args=[event.pk])).content
    assert (
        "<pre>{\n  &quot;name&quot;: &quot;create_note&quot;,\n  &quot;ok&quot;: true\n}</pre>"
        in html.decode()
    )
