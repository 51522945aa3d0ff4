"""A tool or a configuration that went away while a run waited (issue 11 §6): a decision that
would continue the run is refused as unreadable with the reason; cancel still works, and an admin
action cancels the waiting runs of a deactivated configuration."""

from __future__ import annotations

import pytest

from agentruns.exceptions import UnreadableState
from agentruns.models import AgentConfiguration, AgentRun, Effect, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, registry
from agentruns.turns import read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
EPHEMERAL = Tool(
    name="ephemeral_write",
    description="A write tool that an app unregisters while a run waits on it.",
    parameters={"type": "object", "properties": {}},
    effect=Effect.IDEMPOTENT_WRITE,
    func=lambda context, arguments: {"ran": True},
)


@pytest.fixture
def decider(db):
    return UserFactory(
        username="decider", is_staff=True, permissions=[DECIDE, "agentruns.cancel_agentrun"]
    )


def waiting(tool: str = "create_note", arguments: dict | None = None) -> AgentRun:
    call = {"name": tool, "arguments": arguments or {"title": "t", "body": "b"}}
    configuration = AgentConfigurationFactory(script=[{"tool_calls": [call]}, {"content": "ok"}])
    result = runs.run_start_sync(configuration=configuration, prompt="p")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def test_approving_a_call_whose_tool_is_gone_is_refused_with_the_reason(decider):
    registry.register(EPHEMERAL)
    try:
        run = waiting("ephemeral_write", {})
    finally:
        registry.unregister(EPHEMERAL.name)
    digest = card_digest(run)  # the card shows it as an unknown tool now

    with pytest.raises(UnreadableState, match="'ephemeral_write' is no longer registered"):
        runs.run_decide(run_uuid=run.uuid, actor=decider, approved=True, turn_digest=digest)

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL and run.pending_effect == ""
    assert runs.run_cancel(run_uuid=run.uuid, actor=decider) is True


@pytest.mark.parametrize("approved", [True, False])
def test_no_decision_continues_a_run_whose_configuration_was_deactivated(decider, approved):
    run = waiting()
    AgentConfiguration.objects.filter(pk=run.configuration_id).update(is_active=False)

    with pytest.raises(UnreadableState, match="configuration was deactivated"):
        runs.run_decide(
            run_uuid=run.uuid,
            actor=decider,
            approved=approved,
            turn_digest=read_pending_turn(run).turn_digest,
        )
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()


def test_the_admin_action_deactivates_and_cancels_the_waiting_runs(client, db):
    admin_user = UserFactory(username="boss", is_staff=True, is_superuser=True)
    run = waiting()
    other = waiting()  # another configuration, left alone
    client.force_login(admin_user)

    response = client.post(
        "/admin/agentruns/agentconfiguration/",
        {"action": "deactivate_and_cancel_waiting", "_selected_action": [run.configuration_id]},
        follow=True,
    )

    assert "cancelled 1 waiting run" in response.content.decode()
    assert AgentConfiguration.objects.get(pk=run.configuration_id).is_active is False
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert AgentRun.objects.get(pk=other.pk).status == Status.WAITING_FOR_APPROVAL
