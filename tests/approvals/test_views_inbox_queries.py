"""The inbox costs a constant number of queries whatever waits in it: every card kind (approval,
input with a form, reconciliation), several configurations, some with an approver group.

``benchmarks/inbox_render.py`` times the same page with 500 waiting runs.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentruns.models import AgentRun, Effect, Status
from agentruns.turns import PendingTurn
from agentruns.turns.calls import Call
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")
DECIDE = "agentruns.decide_agentrun"
SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "integer"}, "reason": {"type": "string"}},
    "required": ["amount"],
}


def waiting_runs(count: int) -> None:
    """``count`` runs waiting for a person, by thirds approval, input and reconciliation, over
    four configurations (two with an approver group)."""
    group = Group.objects.get_or_create(name="finance")[0]
    configurations = [
        AgentConfigurationFactory(approver_group=group if i < 2 else None) for i in range(4)
    ]
    start = AgentRun.objects.count()
    rows = []
    for i in range(start, start + count):
        write = Call(f"call_{i}", "create_note", {"title": f"t{i}"}, Effect.NON_IDEMPOTENT_WRITE)
        if i % 3 == 0:
            status, turn, fenced = (
                Status.WAITING_FOR_APPROVAL,
                PendingTurn.for_approval([write]),
                False,
            )
        elif i % 3 == 1:
            ask = Call(f"call_{i}", "ask_user", {}, Effect.READ)
            status, turn, fenced = (
                Status.WAITING_FOR_INPUT,
                PendingTurn.for_input(ask, SCHEMA),
                False,
            )
        else:
            approved = PendingTurn.for_approval([write])
            turn = PendingTurn(
                kind="reconciliation", turn_digest=approved.turn_digest, calls=approved.calls
            )
            status, fenced = Status.WAITING_FOR_RECONCILIATION, True
        rows.append(
            AgentRun(
                configuration=configurations[i % 4],
                prompt=f"run {i}",
                status=status,
                lease_epoch=1,
                pending_turn=turn.to_json(),
                pending_effect=Effect.NON_IDEMPOTENT_WRITE if fenced else "",
                pending_call=write.to_json() if fenced else None,
            )
        )
    AgentRun.objects.bulk_create(rows, batch_size=250)


def inbox_queries(client) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(INBOX)
    assert response.status_code == 200
    return len(captured.captured_queries), response.content.decode()


def test_every_card_kind_costs_the_same_queries_for_6_and_500_waiting_runs(client):
    reader = UserFactory(username="reader", permissions=[DECIDE])
    client.force_login(reader)
    client.get(INBOX)

    waiting_runs(6)
    few, html = inbox_queries(client)
    assert html.count('class="approvals-card ') == 6
    assert html.count("Send input") == 2  # the input cards carry their form

    waiting_runs(494)
    many, html = inbox_queries(client)
    assert html.count('class="approvals-card ') == 20
    for kind in ("approval", "input", "reconciliation"):
        assert f"approvals-card-{kind}" in html
    assert "You may not approve" in html  # the cards of the grouped configurations
    assert many == few
