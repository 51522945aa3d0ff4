"""Nothing may 500 on stored data (issue 11 §10): a run whose stored events and pending turn are
corrupt (a call that is not an object, a payload that is not one) reads on every page."""

from __future__ import annotations

import pytest

from agentruns.models import EventKind
from tests.agentruns.factories import AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "payload",
    [
        {"tool_calls": ["not an object"]},
        {"tool_calls": "not a list"},
        ["a payload that is a list"],
        {"content": 5, "tool_calls": [{"name": 3, "function": "x"}], "messages": "x"},
    ],
)
def test_every_page_reads_a_run_with_corrupt_stored_events(client, payload):
    user = UserFactory(username="root", is_superuser=True, is_staff=True)
    run = AgentRunFactory(
        waiting=True,
        initiator=user,
        pending_turn={"kind": "approval", "calls": ["not an object"], "turn_digest": "d"},
    )
    for sequence, kind in enumerate([EventKind.REQUEST, EventKind.LLM, EventKind.TOOL]):
        run.events.create(sequence=sequence, kind=kind, payload=payload)
    client.force_login(user)

    for url in (
        f"/playground/runs/{run.uuid}/",
        f"/admin/approvals/runs/{run.uuid}/",
        "/admin/approvals/",
        f"/api/runs/{run.uuid}/",
        f"/api/runs/{run.uuid}/events/",
        f"/admin/agentruns/agentrun/{run.pk}/change/",
    ):
        assert client.get(url).status_code == 200, url
