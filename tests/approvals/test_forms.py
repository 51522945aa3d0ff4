"""An input form shows its fields in the order the tool declared them, on both databases.

PostgreSQL's jsonb stores object keys sorted (shorter first, then bytewise), so a stored input
schema's properties declared ``z, a, m`` come back ``a, m, z``; the pending turn's
``field_order`` keeps the declared order for the inbox and the playground alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, Effect, Status
from agentruns.services import runs
from agentruns.tools import registry
from agentruns.tools.registry import Tool
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

DECIDE = "agentruns.decide_agentrun"
USE = "playground.use_playground"
DECLARED = ["z", "a", "m"]

ORDER_TOOL = Tool(
    name="order_ask",
    description="Test tool: asks a human for three values declared z, a, m.",
    parameters={"type": "object", "properties": {}},
    effect=Effect.READ,
    func=lambda context, arguments: dict(arguments),
    input_schema={
        "type": "object",
        "properties": {key: {"type": "string", "title": f"Field {key}"} for key in DECLARED},
    },
)


@pytest.fixture
def order_tool() -> Iterator[Tool]:
    registry.register(ORDER_TOOL)
    try:
        yield ORDER_TOOL
    finally:
        registry.unregister(ORDER_TOOL.name)


def waiting_run(user: Any = None) -> AgentRun:
    configuration = AgentConfigurationFactory(
        slug="order",
        tools=[ORDER_TOOL.name],
        script=[{"tool_calls": [{"name": ORDER_TOOL.name, "arguments": {}}]}, {"content": "ok"}],
    )
    result = runs.run_start_sync(configuration=configuration, prompt="ask", initiator=user)
    assert result.run.status == Status.WAITING_FOR_INPUT, result
    run = AgentRun.objects.get(pk=result.run.pk)  # as stored (jsonb may reorder the schema)
    assert run.pending_turn["field_order"] == DECLARED
    return run


def labels(html: str) -> list[str]:
    return re.findall(r"<label for=\"[^\"]+\">Field ([a-z])", html)


@pytest.mark.django_db
def test_the_inbox_shows_the_fields_in_declared_order(client, order_tool):
    run = waiting_run()
    client.force_login(UserFactory(username="decider", permissions=[DECIDE]))
    html = client.get(reverse("approvals:inbox")).content.decode()
    assert f"run-{run.uuid}" in html
    assert labels(html) == DECLARED


@pytest.mark.django_db
def test_the_playground_shows_the_fields_in_declared_order(client, order_tool):
    developer = UserFactory(username="dev", permissions=[USE, DECIDE])
    run = waiting_run(developer)
    client.force_login(developer)
    html = client.get(reverse("playground:run", args=[run.uuid])).content.decode()
    assert labels(html) == DECLARED
