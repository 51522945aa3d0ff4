"""A call's arguments are checked against its tool's schema once per run of the call: by the
segment before the turn runs, and again only when what will run is not what was checked (a tool
resolved afresh to another definition, a person's input laid over the arguments)."""

from __future__ import annotations

from typing import Any

import pytest

from agentruns.models import Effect, Status
from agentruns.services.runs import run_start_sync
from agentruns.tools import Tool, invocation, registry
from agentruns.tools.gate import ToolGate
from tests.agentruns.support.runtime import call, config, tool_turn

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scripted_recordings")]

LOOSE = {"type": "object"}
STRICT = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def _tool(schema: dict[str, Any], ran: list[Any]) -> Tool:
    def body(context: Any, arguments: dict[str, Any]) -> dict[str, Any]:
        ran.append(arguments)
        return {"ok": True}

    return Tool("check_probe", "Test: a read that records its calls.", schema, Effect.READ, body)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every schema check of a call's arguments, as (tool, arguments)."""
    seen: list[Any] = []
    real = invocation.argument_errors

    def counted(tool: Tool, arguments: Any) -> str | None:
        seen.append((tool, arguments))
        return real(tool, arguments)

    monkeypatch.setattr(invocation, "argument_errors", counted)
    monkeypatch.setattr("agentruns.services.runtime.turn_step.argument_errors", counted)
    return seen


def _start(rounds: int) -> Any:
    turns = [tool_turn(call("check_probe", n=n)) for n in range(rounds)]
    return run_start_sync(
        configuration=config(tools=["check_probe"]),
        prompt="check",
        options={"script": [*turns, {"content": "done"}]},
    )


def test_a_read_call_is_checked_once(checks: list[Any]) -> None:
    ran: list[Any] = []
    registry.register(_tool(STRICT, ran))
    try:
        result = _start(3)
    finally:
        registry.unregister("check_probe")
    assert result.run.status == Status.COMPLETED
    assert ran == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert len(checks) == 3


def test_a_tool_resolved_afresh_to_another_definition_is_checked_again(
    checks: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment accepted the arguments for a loose definition; by the time the call runs the
    name resolves to a strict one they break: the body never runs, the model reads the refusal."""
    ran: list[Any] = []
    loose, strict = _tool(LOOSE, ran), _tool(STRICT, ran)
    real = ToolGate.available

    def available(self: ToolGate, name: str) -> Tool | None:
        if name != "check_probe":
            return real(self, name)
        # Loose until the segment has checked the call's arguments, strict from then on.
        return strict if checks else loose

    monkeypatch.setattr(ToolGate, "available", available)
    registry.register(loose)
    try:
        run_script = [tool_turn(call("check_probe", text="not n")), {"content": "done"}]
        result = run_start_sync(
            configuration=config(tools=["check_probe"]),
            prompt="check",
            options={"script": run_script},
        )
    finally:
        registry.unregister("check_probe")
    assert result.run.status == Status.COMPLETED
    assert ran == []  # refused by the definition that would have run
    assert [tool.parameters for tool, _ in checks] == [LOOSE, STRICT]
