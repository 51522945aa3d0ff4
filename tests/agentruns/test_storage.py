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
