"""Storage linear in the dialogue (issue 11 §12): a request event stores what was sent without
the dialogue (its system prompt and a message count), and the messages each request sent are
rebuilt exactly from the prompt and the llm and tool events."""

from __future__ import annotations

import json

import pytest

from agentruns.models import AgentRunEvent, EventKind
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import runs
from agentruns.services.runtime.transcript import request_messages
from tests.agentruns.factories import AgentConfigurationFactory

pytestmark = pytest.mark.django_db

ROUNDS = 8


def test_request_events_do_not_store_the_dialogue_and_rebuild_it_exactly(scripted_recordings):
    script = [{"tool_calls": [{"name": "list_notes", "arguments": {}}]} for _ in range(ROUNDS)] + [
        {"content": "done"}
    ]
    configuration = AgentConfigurationFactory(
        script=script, system_prompt="Be brief.", max_iterations=ROUNDS + 1
    )
    prompt = "p" * 100_000
    result = runs.run_start_sync(configuration=configuration, prompt=prompt)
    received = ScriptedProvider.recorded(str(result.run.uuid))

    requests = AgentRunEvent.objects.filter(run=result.run, kind=EventKind.REQUEST)
    assert requests.count() == ROUNDS + 1
    for request in requests:
        assert "messages" not in request.payload
        assert len(json.dumps(request.payload)) < 500  # a fixed cost, whatever the dialogue
    stored = sum(len(json.dumps(e.payload)) for e in AgentRunEvent.objects.filter(run=result.run))
    assert stored < len(prompt)  # the 100 KB prompt is kept once, on the run row
    assert list(request_messages(result.run).values()) == received


def test_a_tool_event_stores_the_result_once_and_not_the_proposed_arguments(
    scripted_recordings, probes
):
    """The model's arguments live in the ``llm`` event that proposed them and the result once in
    the ``tool`` event: the tool message is derived from it (canonical JSON, so PostgreSQL's
    reordered ``jsonb`` keys rebuild the very text that was sent)."""
    big = "x" * 50_000
    script = [
        {"tool_calls": [{"name": "probe_read", "arguments": {"value": big}}]},
        {"content": "done"},
    ]
    configuration = AgentConfigurationFactory(script=script, tools=["probe_read"])
    result = runs.run_start_sync(configuration=configuration, prompt="p")
    received = ScriptedProvider.recorded(str(result.run.uuid))

    events = list(AgentRunEvent.objects.filter(run=result.run).order_by("sequence"))
    [tool] = [e for e in events if e.kind == EventKind.TOOL]
    assert "arguments" not in tool.payload and "content" not in tool.payload
    assert tool.payload["result"] == {"probed": "probe_read", "value": big}
    # The argument is stored by the llm event, the result by the tool event: twice in all,
    # as the dialogue itself holds it twice (the call and its result).
    stored = "".join(json.dumps(e.payload) for e in events)
    assert stored.count(big) == 2
    assert list(request_messages(result.run).values()) == received
    [tool_message] = [m for m in received[-1] if m["role"] == "tool"]
    assert json.loads(tool_message["content"]) == {"probed": "probe_read", "value": big}


def test_the_system_prompt_and_the_tools_are_stored_when_they_change(scripted_recordings):
    script = [{"tool_calls": [{"name": "list_notes", "arguments": {}}]} for _ in range(3)] + [
        {"content": "done"}
    ]
    configuration = AgentConfigurationFactory(
        script=script, system_prompt="S" * 10_000, max_iterations=3
    )
    result = runs.run_start_sync(configuration=configuration, prompt="p")
    received = ScriptedProvider.recorded(str(result.run.uuid))

    requests = list(
        AgentRunEvent.objects.filter(run=result.run, kind=EventKind.REQUEST).order_by("sequence")
    )
    # Three rounds with tools, then the final call of the round cap with none.
    assert [("system" in r.payload, "tools" in r.payload) for r in requests] == [
        (True, True),
        (False, False),
        (False, False),
        (False, True),
    ]
    assert requests[-1].payload["tools"] == [] and requests[-1].payload["final"] is True
    assert list(request_messages(result.run).values()) == received
