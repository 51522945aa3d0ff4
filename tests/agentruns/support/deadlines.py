"""Runs waiting for approval or input with an approval deadline (shared by the deadline tests)."""

from __future__ import annotations

from datetime import timedelta

from agentruns.models import (
    AgentRun,
)
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from tests.agentruns.support.runtime import (
    call,
    config,
    tool_turn,
)

WRITE = call("probe_create", value="x")


#: A deadline that has passed by the time anything reads it.
AT_ONCE = timedelta(microseconds=1)


LONG = timedelta(minutes=30)


def waiting_for_approval(*, timeout: timedelta | None = LONG, action: str = "deny") -> AgentRun:
    configuration = config(
        script=[tool_turn(WRITE), {"content": "done"}],
        approval_timeout=timeout,
        on_approval_timeout=action,
    )
    result = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return AgentRun.objects.get(pk=result.run.pk)


def waiting_for_input(*, timeout: timedelta | None = LONG, action: str = "deny") -> AgentRun:
    configuration = config(
        script=[tool_turn(call("probe_ask", question="which colour?")), {"content": "thanks"}],
        approval_timeout=timeout,
        on_approval_timeout=action,
    )
    result = runs.run_start_sync(configuration=configuration, prompt="ask me")
    assert result.outcome == Outcome.AWAITING_INPUT
    return AgentRun.objects.get(pk=result.run.pk)
