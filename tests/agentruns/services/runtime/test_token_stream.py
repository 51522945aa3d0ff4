"""Token streaming in whole runs, against the real local servers of both providers: a watched
segment streams each answer and stores exactly what an unwatched one stores (one ``llm`` event
per answer, nothing per token); a process dying mid-stream leaves no answer, and the reaper and
a worker ask the model again as after any call that did not finish."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    Provider,
    Status,
    TerminationReason,
)
from agentruns.services import reaper, runs
from agentruns.services.reaper.rules import Rule, Verdict
from agentruns.services.runtime import token_stream
from agentruns.services.runtime.results import Outcome
from tests.agentruns.support.crashes import ProcessDied
from tests.support.chat_server import ChatServer, completion
from tests.support.messages_server import MessagesServer, message
from tests.support.sse import chat_frames, message_frames

pytestmark = pytest.mark.django_db(transaction=True)

KEY_ENV = "LEASEHOLD_TEST_TOKEN_STREAM_KEY"
KEY = "sk-token-stream-0123456789"
ANSWER = "You have <b>no</b> notes & nothing due."


class Watcher:
    """Records what a token watcher is told, in order; ``dies_after``: the process vanishes
    once that many pieces arrived."""

    def __init__(self, dies_after: int | None = None) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.dies_after = dies_after

    def begin(self) -> None:
        self.seen.append(("begin", None))

    def text(self, piece: str) -> None:
        self.seen.append(("text", piece))
        if self.dies_after is not None and len(self.texts()) >= self.dies_after:
            raise ProcessDied()

    def end(self, *, answered: bool) -> None:
        self.seen.append(("end", answered))

    def texts(self) -> list[str]:
        return [piece for kind, piece in self.seen if kind == "text"]

    def calls(self) -> list[str]:
        """The text of each call, joined."""
        joined: list[str] = []
        for kind, piece in self.seen:
            if kind == "begin":
                joined.append("")
            elif kind == "text":
                joined[-1] += piece
        return joined


class Remote:
    """One provider's local server and a configuration using it."""

    def __init__(self, name: str, server: ChatServer, monkeypatch) -> None:
        monkeypatch.setenv(KEY_ENV, KEY)
        self.name, self.server = name, server
        self.config = AgentConfiguration.objects.create(
            slug=f"{name}-stream",
            name=f"{name} streamed",
            provider=Provider.OPENAI if name == "openai" else Provider.ANTHROPIC,
            model="test-model",
            base_url=server.base_url,
            api_key_env=KEY_ENV,
            timeout_seconds=5,
            tools=["list_notes"],
        )

    def tool_call(self) -> None:
        if self.name == "openai":
            self.server.reply(
                content="Looking.", tool_calls=[{"id": "call_1", "name": "list_notes"}]
            )
        else:
            self.server.reply(text="Looking.", tool_uses=[{"id": "toolu_1", "name": "list_notes"}])

    def answer(self, text: str = ANSWER) -> None:
        if self.name == "openai":
            self.server.reply(content=text)
        else:
            self.server.reply(text=text)

    def cut(self, text: str, after: int) -> None:
        if self.name == "openai":
            frames = chat_frames(completion(content=text), {})
        else:
            frames = message_frames(message(text=text), {})
        self.server.stream_raw(frames, drop_after=after)

    def streamed(self) -> list[bool]:
        return [bool((r.body or {}).get("stream")) for r in self.server.requests]


@pytest.fixture(params=["openai", "anthropic"])
def remote(request, monkeypatch) -> Any:
    server = ChatServer() if request.param == "openai" else MessagesServer()
    with server:
        yield Remote(request.param, server, monkeypatch)


def stored(run: AgentRun) -> list[tuple[str, dict]]:
    """The run's events without what differs between two runs (times, ids)."""
    keep = []
    for event in AgentRunEvent.objects.filter(run=run).order_by("sequence"):
        payload = {
            k: v
            for k, v in event.payload.items()
            if k not in ("segment", "lease_expires", "idempotency_key")
        }
        keep.append((event.kind, payload))
    return keep


def test_a_watched_run_streams_each_answer_and_stores_what_an_unwatched_run_stores(remote):
    for _ in range(2):
        remote.tool_call()
        remote.answer()
    watcher = Watcher()

    with token_stream.watching(watcher):
        watched = runs.run_start_sync(configuration=remote.config, prompt="notes?").run
    plain = runs.run_start_sync(configuration=remote.config, prompt="notes?").run

    assert (watched.status, watched.output) == (Status.COMPLETED, ANSWER)
    assert (plain.status, plain.output) == (Status.COMPLETED, ANSWER)
    assert remote.streamed() == [True, True, False, False]
    # One llm event per answer, nothing per token: the same rows as the unwatched run.
    assert stored(watched) == stored(plain)
    answers = [p["content"] for kind, p in stored(watched) if kind == EventKind.LLM]
    assert watcher.calls() == answers == ["Looking.", ANSWER]
    assert len(watcher.texts()) > len(answers)  # each answer came in pieces
    assert [s for s in watcher.seen if s[0] == "end"] == [("end", True), ("end", True)]
    assert (watched.total_tokens, watched.iterations) == (plain.total_tokens, plain.iterations)


def test_with_streaming_off_a_watched_run_sends_the_plain_request(remote, settings):
    settings.AGENTRUNS = {"STREAM_TOKENS": False}
    remote.answer()
    watcher = Watcher()

    with token_stream.watching(watcher):
        run = runs.run_start_sync(configuration=remote.config, prompt="notes?").run

    assert run.output == ANSWER
    assert remote.streamed() == [False]
    assert watcher.seen == []


def test_a_stream_cut_mid_way_is_a_model_call_that_failed(remote):
    remote.cut("an answer the connection cuts", after=4)
    watcher = Watcher()

    with token_stream.watching(watcher):
        result = runs.run_start_sync(configuration=remote.config, prompt="notes?")

    run = result.run
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.PROVIDER_FAILED,
    )
    assert run.error["type"] == "ProviderError:connection"
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).exists()
    assert watcher.texts() and watcher.seen[-1] == ("end", False)


def test_a_process_dying_mid_stream_leaves_no_answer_and_the_call_is_retried(remote):
    remote.answer("This answer is never finished by the first process.")
    remote.answer()
    watcher = Watcher(dies_after=2)

    with token_stream.watching(watcher), pytest.raises(ProcessDied):
        runs.run_start_sync(configuration=remote.config, prompt="notes?")

    run = AgentRun.objects.get()
    assert (run.status, run.output) == (Status.RUNNING, "")
    assert [e.kind for e in AgentRunEvent.objects.filter(run=run).order_by("sequence")] == [
        EventKind.LEASE,
        EventKind.REQUEST,
    ]  # two pieces were shown; nothing of the answer was stored
    assert watcher.texts()[:2] and watcher.seen[-1] == ("end", False)

    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    [verdict] = reaper.reap_stale_runs().verdicts
    assert (verdict.rule, verdict.verdict) == (Rule.RECLAIM, Verdict.REQUEUED)
    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert (run.status, run.output, run.requeue_count) == (Status.COMPLETED, ANSWER, 1)
    llm = AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM)
    assert [e.payload["content"] for e in llm] == [ANSWER]
    assert remote.streamed() == [True, False]  # the worker's retry has no watcher
