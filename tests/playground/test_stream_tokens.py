"""The playground's live view receives a streamed answer's tokens in order, before the answer's
recorded step, as text (never HTML), and no token is stored (a Django test client reading the
NDJSON response as it streams, against the real local chat-completions server)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, Provider, Status
from tests.playground.conftest import join_streams
from tests.support.chat_server import ChatServer, completion
from tests.support.sse import chat_frames

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "LEASEHOLD_TEST_PLAYGROUND_STREAM_KEY"
HOSTILE = 'Done. <script>alert("x")</script><img src=x onerror=alert(1)> & that is all.'


@pytest.fixture(autouse=True)
def _segments_stop():
    yield
    join_streams()


@pytest.fixture
def streamed_config(chat_server: ChatServer, monkeypatch) -> AgentConfiguration:
    monkeypatch.setenv(KEY_ENV, "sk-playground-stream-0123456789")
    return AgentConfiguration.objects.create(
        slug="streamed",
        name="Streamed",
        provider=Provider.OPENAI,
        model="test-model",
        base_url=chat_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=5,
        tools=["list_notes"],
    )


def lines(response) -> Iterator[dict]:
    for chunk in response.streaming_content:
        for line in chunk.decode().splitlines():
            yield json.loads(line)


def test_the_live_view_receives_the_tokens_in_order_before_the_recorded_answer(
    dev_client, chat_server, streamed_config
):
    chat_server.reply(content="Let me look.", tool_calls=[{"id": "c1", "name": "list_notes"}])
    frames = chat_frames(completion(content=HOSTILE), {"stream_options": {"include_usage": True}})
    chat_server.stream_raw(frames, delay=0.02)  # pieces 20 ms apart: several lines

    response = dev_client.post("/playground/stream/", {"configuration": "streamed", "prompt": "?"})
    received = list(lines(response))

    run = AgentRun.objects.get()
    assert run.status == Status.COMPLETED and run.output == HOSTILE
    kinds = [line.get("kind", line["event"]) for line in received]
    # Each call's tokens come between its request and its recorded answer.
    collapsed = [k for i, k in enumerate(kinds) if k != "tokens" or kinds[i - 1] != "tokens"]
    assert collapsed == [
        "lease",
        "request",
        "tokens",
        "llm",
        "tool",
        "request",
        "tokens",
        "llm",
        "end",
    ]
    tokens = [line for line in received if line["event"] == "tokens"]
    by_call: dict[int, str] = {}
    for line in tokens:
        assert set(line) <= {"event", "run", "call", "start", "text", "dropped", "end"}
        assert "html" not in line  # model text goes to the page as text only
        assert line["run"] == str(run.uuid)
        by_call[line["call"]] = by_call.get(line["call"], "") + line["text"]
    assert by_call == {1: "Let me look.", 2: HOSTILE}
    assert len([t for t in tokens if t["call"] == 2 and t["text"]]) > 3
    assert [t.get("start") for t in tokens if t.get("start")] == [True, True]
    assert [t["end"] for t in tokens if "end" in t] == ["answered", "answered"]
    # No row per token: the stored events are the step lines, one llm event per answer.
    stored = [e.kind for e in AgentRunEvent.objects.filter(run=run).order_by("sequence")]
    assert stored == [line["kind"] for line in received if line["event"] == "step"]
    recorded = next(line for line in reversed(received) if line.get("kind") == "llm")
    assert "&lt;script&gt;" in recorded["html"] and "<script>" not in recorded["html"]


def test_a_call_cut_mid_stream_ends_its_tokens_failed_and_records_no_answer(
    dev_client, chat_server, streamed_config
):
    chat_server.stream_raw(
        chat_frames(completion(content="half an answer, then"), {}), drop_after=4
    )

    response = dev_client.post("/playground/stream/", {"configuration": "streamed", "prompt": "?"})
    received = list(lines(response))

    tokens = [line for line in received if line["event"] == "tokens"]
    assert "".join(t["text"] for t in tokens) and tokens[-1]["end"] == "failed"
    assert "llm" not in [line.get("kind") for line in received]
    assert (
        received[-1]["event"] == "end" and received[-1]["termination_reason"] == "provider_failed"
    )


def test_the_page_shows_tokens_as_text_nodes_only():
    """The script adds a token line's text with ``createTextNode`` and never as HTML."""
    from django.template.loader import render_to_string

    script = render_to_string("playground/_stream_script.html")
    live = script[script.index("function live(") : script.index("function settleLive(")]
    assert "createTextNode(String(message.text))" in live
    assert "innerHTML" not in live and "insertAdjacentHTML" not in live
