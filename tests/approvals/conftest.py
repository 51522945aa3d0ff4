"""Fixtures for the inbox: deciders, and real waiting runs made by the runtime itself.

``waiting_run`` / ``input_run`` start a scripted run that suspends for approval / input;
``in_doubt_run`` makes a real segment die mid non-idempotent write and lets the reaper park it
in ``waiting_for_reconciliation``; ``bulk_waiting_runs`` inserts many valid waiting rows at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentruns.models import AgentConfiguration, AgentRun, Status
from agentruns.services import reaper, runs
from agentruns.services.runtime import tool_step
from agentruns.turns import turn_digest
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

DECIDE = "agentruns.decide_agentrun"
NOTE = {"title": "Quarterly report", "body": "Numbers up."}


def write_script(arguments: dict[str, Any] | None = None, name: str = "create_note") -> list:
    return [
        {"tool_calls": [{"name": name, "arguments": arguments or NOTE}]},
        {"content": "Done."},
    ]


def input_script(question: str = "Which priority?") -> list:
    return [
        {"tool_calls": [{"name": "ask_human", "arguments": {"question": question}}]},
        {"content": "Thanks."},
    ]


@pytest.fixture
def decider(db):
    return UserFactory(username="decider", permissions=[DECIDE])


@pytest.fixture
def colleague(db):
    return UserFactory(username="colleague", permissions=[DECIDE])


@pytest.fixture
def initiator(db):
    return UserFactory(username="initiator", permissions=[DECIDE])


def start_waiting_run(
    *,
    initiator=None,
    arguments: dict[str, Any] | None = None,
    tool: str = "create_note",
    four_eyes: bool = False,
    configuration: AgentConfiguration | None = None,
) -> AgentRun:
    """A real run, started by the runtime, now ``waiting_for_approval`` on one write."""
    config = configuration or AgentConfigurationFactory(require_second_approver=four_eyes)
    result = runs.run_start_sync(
        configuration=config,
        prompt="Write the report note",
        initiator=initiator,
        options={"script": write_script(arguments, tool)},
    )
    assert result.run.status == Status.WAITING_FOR_APPROVAL, result.outcome
    return AgentRun.objects.select_related("configuration", "initiator").get(pk=result.run.pk)


def start_input_run(
    *,
    initiator=None,
    question: str = "Which priority?",
    configuration: AgentConfiguration | None = None,
) -> AgentRun:
    """A real run, started by the runtime, now ``waiting_for_input`` from ``ask_human``."""
    result = runs.run_start_sync(
        configuration=configuration or AgentConfigurationFactory(),
        prompt="Ask the operator",
        initiator=initiator,
        options={"script": input_script(question)},
    )
    assert result.run.status == Status.WAITING_FOR_INPUT, result.outcome
    return AgentRun.objects.get(pk=result.run.pk)


class SegmentDied(BaseException):
    """Stands for the process dying: not an ``Exception``, so nothing in the loop catches it."""


def make_in_doubt_run(
    *,
    decider,
    monkeypatch: pytest.MonkeyPatch,
    initiator=None,
    configuration: AgentConfiguration | None = None,
) -> AgentRun:
    """A run whose worker died inside ``create_note`` after the fence was stamped; once its
    lease has expired the reaper parks it in ``waiting_for_reconciliation`` (rule 1)."""
    run = start_waiting_run(initiator=initiator, configuration=configuration)
    runs.run_decide(
        run_uuid=run.uuid,
        actor=decider,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="queued",
    )

    def die(tool, arguments, context, **options):
        raise SegmentDied()

    with monkeypatch.context() as patch:
        patch.setattr(tool_step, "invoke_tool", die)
        with pytest.raises(SegmentDied):
            runs.run_process_queued(run_uuid=run.uuid)
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.pending_effect == "non_idempotent_write"
    # Time passes: the dead worker's lease runs out.
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=timezone.now() - timedelta(minutes=5))
    reaper.reap_stale_runs(redispatch=False)
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION, run.status
    return run


def approval_turn(index: int, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    calls = [{"id": f"call_{index}", "name": "create_note", "arguments": arguments or NOTE}]
    return {
        "kind": "approval",
        "calls": [{**c, "effect": "non_idempotent_write", "known": True} for c in calls],
        "turn_digest": turn_digest(calls),
    }


def bulk_waiting_runs(count: int, *, initiator=None) -> list[AgentRun]:
    """``count`` rows waiting for approval with a valid pending turn, in one INSERT batch."""
    config = AgentConfigurationFactory()
    return AgentRun.objects.bulk_create(
        [
            AgentRun(
                configuration=config,
                initiator=initiator,
                prompt=f"bulk {i}",
                status=Status.WAITING_FOR_APPROVAL,
                lease_epoch=1,
                pending_turn=approval_turn(i),
            )
            for i in range(count)
        ],
        batch_size=250,
    )
