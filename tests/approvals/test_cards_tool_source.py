"""Where a call's tool comes from, wherever a person decides on it (issue 16 §4): the tool's
description, its MCP server (name, transport, URL or command) and the server's hints marked as
declared by the server, not verified — on the approval card, the reconciliation card, the
playground and the API's pending turn; and the arguments' keys in the order the model sent them.
"""

from __future__ import annotations

import html as htmllib
from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from agentruns.models import AgentRun, McpServer, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import Call, PendingTurn, read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.support.mcp_server import TicketServer, warm_sessions
from tests.support.mcp_server import server_row as synced_row

TICKET = "mcp__tix__create_ticket"
NOTE = "declared by the server, not verified"
# The model sends these keys in this order; PostgreSQL's jsonb would store them a, mm, zeta.
ARGUMENTS = {"zeta": "last?", "a": "first?", "mm": "middle?"}


def server_row(mcp_server: TicketServer, **fields: Any) -> McpServer:
    row: McpServer = synced_row(mcp_server, **fields)
    return row


def waiting_run(initiator: Any = None) -> AgentRun:
    script = [{"tool_calls": [{"name": TICKET, "arguments": {"title": "printer on fire"}}]}]
    configuration = AgentConfigurationFactory(script=[*script, {"content": "filed"}])
    result = runs.run_start_sync(configuration=configuration, prompt="file it", initiator=initiator)
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def assert_source_shown(page: str, url: str) -> None:
    text = htmllib.unescape(page)
    assert "Open a ticket with a title." in text  # the tool's own description
    assert "tix" in text and "streamable_http" in text and url in text
    assert NOTE in text and "readOnlyHint=True" in text


@pytest.mark.django_db(transaction=True)
def test_the_approval_card_names_the_tool_its_server_and_the_unverified_hints(
    mcp_server: TicketServer, client: Any
) -> None:
    server_row(mcp_server)
    waiting_run()
    client.force_login(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    page = client.get(reverse("approvals:inbox")).content.decode()
    assert_source_shown(page, mcp_server.url)


@pytest.mark.django_db(transaction=True)
def test_the_reconciliation_card_names_the_source_of_the_call_in_doubt(
    mcp_server: TicketServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = server_row(mcp_server, requires_approval=False, timeout_seconds=1)
    warm_sessions(monkeypatch, row)  # the 1s is the call's alone, not a session's slow start
    configuration = AgentConfigurationFactory(
        script=[{"tool_calls": [{"name": TICKET, "arguments": {"title": "t"}}]}]
    )
    mcp_server.hold()
    try:
        result = runs.run_start_sync(configuration=configuration, prompt="file it")
    finally:
        mcp_server.release()
    assert result.run.status == Status.WAITING_FOR_RECONCILIATION
    client.force_login(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    page = client.get(reverse("approvals:inbox")).content.decode()
    assert "Waiting for reconciliation" in page
    assert_source_shown(page, mcp_server.url)
    assert "after it was sent" in htmllib.unescape(page)


@pytest.mark.django_db(transaction=True)
def test_the_playground_shows_the_source_of_a_pending_call(
    mcp_server: TicketServer, client: Any
) -> None:
    server_row(mcp_server)
    developer = UserFactory(permissions=["playground.use_playground", "agentruns.decide_agentrun"])
    run = waiting_run(initiator=developer)
    client.force_login(developer)
    page = client.get(f"/playground/runs/{run.uuid}/").content.decode()
    assert "Waiting for approval" in page
    assert_source_shown(page, mcp_server.url)


@pytest.mark.django_db(transaction=True)
def test_the_api_pending_turn_carries_the_tool_origin_and_the_schema_documents_it(
    mcp_server: TicketServer,
) -> None:
    server_row(mcp_server, read_only_tools=["echo"])
    run = waiting_run()
    api = APIClient()
    api.force_authenticate(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    body = api.get(f"/api/runs/{run.uuid}/").json()
    [shown] = body["pending_turn"]["calls"]
    assert shown["tool"] == {
        "description": "Open a ticket with a title.",
        "source": "mcp",
        "server": {
            "name": "tix",
            "transport": "streamable_http",
            "endpoint": mcp_server.url,
            "enabled": True,
        },
        "hints": {"destructiveHint": "False", "idempotentHint": "True", "readOnlyHint": "True"},
        "hints_note": NOTE,
        "read_only_by_operator": False,  # only echo is listed
    }
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    call_schema = schema["components"]["schemas"]["Call"]
    assert "tool" in call_schema["properties"] and "tool" in call_schema["required"]
    origin = schema["components"]["schemas"]["ToolOrigin"]
    assert {"description", "source", "server", "hints", "hints_note"} <= set(origin["properties"])
    assert "not verified" in origin["properties"]["hints"]["description"]


@pytest.mark.django_db
def test_arguments_keep_the_order_the_model_sent_them_through_storage(client: Any) -> None:
    """On PostgreSQL jsonb reorders the stored keys (a, mm, zeta); the stored order restores them
    for every reader. On SQLite the order survives anyway; the readers must not sort it."""
    call = Call(id="c1", name="create_note", arguments=dict(ARGUMENTS), effect="idempotent_write")
    configuration = AgentConfigurationFactory(script=[{"content": "x"}])
    run = AgentRun.objects.create(
        configuration=configuration,
        prompt="p",
        status=Status.WAITING_FOR_APPROVAL,
        pending_turn=PendingTurn.for_approval([call]).to_json(),
    )
    run.refresh_from_db()
    [read] = read_pending_turn(run).calls
    assert list(read.arguments) == ["zeta", "a", "mm"]

    api = APIClient()
    api.force_authenticate(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    response = api.get(f"/api/runs/{run.uuid}/")
    text = response.content.decode()
    assert text.index('"zeta"') < text.index('"a"') < text.index('"mm"')

    client.force_login(UserFactory(is_staff=True, permissions=["agentruns.decide_agentrun"]))
    page = htmllib.unescape(client.get(reverse("approvals:inbox")).content.decode())
    assert page.index('"zeta"') < page.index('"a": "first?"') < page.index('"mm"')
