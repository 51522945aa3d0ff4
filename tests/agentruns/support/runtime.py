"""Helpers shared by the runtime tests: probe tools, deciders, run and event inspection.

The probe tools are registered only for the test that asks for them (``probes`` fixture) and
unregistered afterwards, so the global registry is left as the apps configured it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection

from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, Effect
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services.runs import run_decide
from agentruns.services.runtime.results import SegmentResult
from agentruns.tools import OutcomeUnknown, Tool, ToolContext, registry
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

DECIDE = "agentruns.decide_agentrun"


@dataclass
class Probe:
    """What the probe tools saw: one entry per body execution."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    # Called inside the body (before recording returns); lets a test act "during" a tool call.
    during: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, context: ToolContext, arguments: dict[str, Any], name: str) -> dict:
        row = (
            AgentRun.objects.filter(uuid=context.run_uuid)
            .values(
                "status",
                "claimed_by",
                "lease_epoch",
                "lease_expires",
                "pending_effect",
                "pending_call",
            )
            .first()
        )
        entry = {
            "tool": name,
            "arguments": arguments,
            "row": row,
            "fencing_token": context.fencing_token,
            "idempotency_key": context.idempotency_key,
            "call_id": context.call_id,
            "initiator_id": context.initiator_id,
        }
        with self.lock:
            self.seen.append(entry)
        if self.during is not None:
            self.during(entry)
        return entry


PROBE = Probe()

_OBJECT = {
    "type": "object",
    "properties": {"value": {"type": "string"}},
    "additionalProperties": False,
}


def _probe_body(name: str):
    def body(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
        PROBE.record(context, arguments, name)
        return {"probed": name, "value": arguments.get("value")}

    body.__qualname__ = f"probe_{name}"
    return body


def _raising_body(context: ToolContext, arguments: dict[str, Any]) -> Any:
    PROBE.record(context, arguments, "probe_raises")
    raise RuntimeError("the probe exploded")


def _ask_body(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    PROBE.record(context, arguments, "probe_ask")
    return {"question": arguments["question"], "answer": arguments.get("answer")}


PROBE_TOOLS: tuple[Tool, ...] = (
    Tool(
        name="probe_read",
        description="Test probe: a read that records the run row as its body sees it.",
        parameters=_OBJECT,
        effect=Effect.READ,
        func=_probe_body("probe_read"),
    ),
    Tool(
        name="probe_write",
        description="Test probe: an idempotent write that records the run row.",
        parameters=_OBJECT,
        effect=Effect.IDEMPOTENT_WRITE,
        func=_probe_body("probe_write"),
    ),
    Tool(
        name="probe_create",
        description="Test probe: a non-idempotent write that records the run row.",
        parameters=_OBJECT,
        effect=Effect.NON_IDEMPOTENT_WRITE,
        func=_probe_body("probe_create"),
    ),
    Tool(
        name="probe_raises",
        description="Test probe: a read whose body raises.",
        parameters=_OBJECT,
        effect=Effect.READ,
        func=_raising_body,
    ),
    Tool(
        # No additionalProperties on the input schema: undeclared human keys must be ignored by
        # the overlay itself, not only refused by validation.
        name="probe_ask",
        description="Test probe: a read that needs an answer from a human.",
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string"},
                "answer": {"type": "string"},
                "priority": {"type": "integer"},
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        effect=Effect.READ,
        func=_ask_body,
        input_schema={
            "type": "object",
            "properties": {"answer": {"type": "string", "minLength": 1}},
            "required": ["answer"],
        },
    ),
)
PROBE_NAMES = [t.name for t in PROBE_TOOLS]


@pytest.fixture
def probes() -> Iterator[Probe]:
    """Register the probe tools for one test; yields the shared recorder (cleared)."""
    PROBE.seen.clear()
    PROBE.during = None
    for probe_tool in PROBE_TOOLS:
        registry.register(probe_tool)
    try:
        yield PROBE
    finally:
        for probe_tool in PROBE_TOOLS:
            registry.unregister(probe_tool.name)
        PROBE.seen.clear()
        PROBE.during = None


def outcome_unknown_once(reason: str = "the connection closed after the request was sent"):
    """A ``Probe.during`` hook: the first execution raises ``OutcomeUnknown`` after recording
    itself (the write may have happened), like a webhook that timed out after it was sent; later
    executions return normally."""
    raised: list[str] = []

    def during(entry: dict[str, Any]) -> None:
        if not raised:
            raised.append(entry["call_id"])
            raise OutcomeUnknown(reason)

    return during


def config(*, tools: list[str] | None = None, **fields: Any) -> AgentConfiguration:
    """A scripted configuration offering ``tools`` (the probes and the playground notes)."""
    names = tools if tools is not None else [*PROBE_NAMES, "list_notes", "read_note"]
    return AgentConfigurationFactory(tools=names, **fields)


def decider(**fields: Any):
    return UserFactory(permissions=[DECIDE], **fields)


def decide_inline(run: AgentRun, *, actor: Any = None, approved: bool = True) -> SegmentResult:
    """``run_decide`` on the pending turn ``run`` holds (this instance, not refreshed), inline;
    ``actor`` defaults to a new user with the decide permission."""
    return run_decide(
        run_uuid=run.uuid,
        actor=actor if actor is not None else decider(),
        approved=approved,
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def tool_turn(*calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tool_calls": list(calls), **extra}


def events(run: AgentRun) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run_id=run.pk).order_by("sequence"))


def kinds(run: AgentRun) -> list[str]:
    return [e.kind for e in events(run)]


def assert_contiguous(run: AgentRun) -> list[AgentRunEvent]:
    stream = events(run)
    assert [e.sequence for e in stream] == list(range(len(stream)))
    return stream


def assert_released(run: AgentRun) -> None:
    """No claim, no lease, no fence."""
    run.refresh_from_db()
    assert run.claimed_by == ""
    assert run.lease_expires is None
    assert run.pending_effect == ""
    assert run.pending_call is None


def snapshot(run: AgentRun) -> dict[str, Any]:
    """Every column of the run plus its event stream: compare before and after a refusal."""
    fresh = AgentRun.objects.filter(pk=run.pk).values().get()
    stream = list(
        AgentRunEvent.objects.filter(run_id=run.pk)
        .order_by("sequence")
        .values_list("pk", flat=True)
    )
    return {"row": fresh, "events": stream}


def sent(run: AgentRun) -> list[list[dict[str, Any]]]:
    """The message lists the scripted provider received for ``run``, one per call (the test
    uses the ``scripted_recordings`` fixture)."""
    assert ScriptedProvider.is_recording(), "sent() needs the scripted_recordings fixture"
    return ScriptedProvider.recorded(str(run.uuid))


def tool_messages(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}


def db_now():
    """The database clock (the one lease arithmetic uses)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        from django.utils import timezone

        return timezone.now()
