"""A tool's result that no column can store never strands a run (docs/design.md §4.1): a read and
an approved non-idempotent write each return NUL, lone surrogates, NaN / Infinity, nesting past
the bound, a result past the size bound, raise an error text holding NUL, or return what JSON
cannot hold. Each time the tool runs once (the write lands once), the run goes on to the next
model round and completes, the ``tool`` event stores the result mended and marked
(``normalised``), the model reads exactly what is stored, the ledger verifies, and no lease, no
fence and no reaper is involved. Run this module on SQLite and on PostgreSQL (the one that
refuses NUL in ``jsonb``). Remote (MCP) results: tools/test_mcp_wire.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from agentruns import audit
from agentruns.models import AgentRun, Effect, EventKind, Status, TerminationReason
from agentruns.services import reaper, reconciliation, runs
from agentruns.services.runtime.transcript import tool_message_content
from agentruns.storable import REPLACEMENT
from agentruns.tools import (
    CheckAnswer,
    CheckContext,
    OutcomeUnknown,
    Tool,
    ToolContext,
    invocation,
    registry,
)
from agentruns.tools.invocation import MAX_RESULT_CHARS, MAX_RESULT_DEPTH
from playground import trace
from playground.models import Note
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import (
    assert_contiguous,
    assert_released,
    call,
    config,
    decide_inline,
    decider,
    events,
    sent,
    tool_messages,
    tool_turn,
)

pytestmark = pytest.mark.django_db


R = REPLACEMENT
PATHS = ["sync", "worker"]
TOOLS = ["hostile_read", "hostile_write"]
ALL_TOOLS = [*TOOLS, "hostile_previewed", "hostile_doubtful"]


@dataclass
class Hostile:
    """What the hostile tools return (or raise), and every execution of their bodies."""

    returns: Callable[[], Any] = lambda: None
    raises: Callable[[], BaseException] | None = None
    ran: list[tuple[str, str]] = field(default_factory=list)

    def body(self, name: str) -> Callable[[ToolContext, dict[str, Any]], Any]:
        def run(context: ToolContext, arguments: dict[str, Any]) -> Any:
            self.ran.append((name, context.call_id))
            if name == "hostile_write":  # the write's effect: one note per execution
                Note.objects.create(title=f"written by {context.idempotency_key}", body="")
            if self.raises is not None:
                raise self.raises()
            return self.returns()

        return run

    def doubtful(self, context: ToolContext, arguments: dict[str, Any]) -> Any:
        self.body("hostile_write")(context, arguments)
        raise OutcomeUnknown("the connection closed after the request was sent")

    def check(self, context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
        return self.answer()

    answer: Callable[[], CheckAnswer] = CheckAnswer.unknown


def hostile_preview(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "summary": "creates a note \x00",
        "target": "notes\ud800",
        "changes": [{"field": "title\x00", "before": math.nan, "after": {"t": "\udfff"}}],
    }


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    recorder = Hostile()
    tools = [
        Tool(
            name="hostile_read",
            description="Test tool: a read returning what the test sets.",
            parameters={"type": "object", "properties": {}},
            effect=Effect.READ,
            func=recorder.body("hostile_read"),
        ),
        Tool(
            name="hostile_write",
            description="Test tool: a non-idempotent write (one note) returning what is set.",
            parameters={"type": "object", "properties": {}},
            effect=Effect.NON_IDEMPOTENT_WRITE,
            func=recorder.body("hostile_write"),
        ),
        Tool(
            name="hostile_previewed",
            description="Test tool: a non-idempotent write whose preview cannot be stored.",
            parameters={"type": "object", "properties": {}},
            effect=Effect.NON_IDEMPOTENT_WRITE,
            func=recorder.body("hostile_write"),
            preview=hostile_preview,
        ),
        Tool(
            name="hostile_doubtful",
            description="Test tool: a write that lands, then cannot tell; its check can.",
            parameters={"type": "object", "properties": {}},
            effect=Effect.NON_IDEMPOTENT_WRITE,
            func=recorder.doubtful,
            check=recorder.check,
        ),
    ]
    for tool in tools:
        registry.register(tool)
    try:
        yield recorder
    finally:
        for tool in tools:
            registry.unregister(tool.name)


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"down": value}
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict) and value:
        value, depth = next(iter(value.values())), depth + 1
    return depth


def run_to_the_end(name: str, path: str) -> AgentRun:
    """A run whose model calls ``name`` once, then answers "done"; a write is approved."""
    configuration = config(tools=ALL_TOOLS, script=[tool_turn(call(name)), {"content": "done"}])
    if path == "sync":
        run = runs.run_start_sync(configuration=configuration, prompt="go").run
        if run.status == Status.WAITING_FOR_APPROVAL:
            run = decide_inline(run).run
        return AgentRun.objects.get(pk=run.pk)
    queued = runs.run_enqueue(configuration=configuration, prompt="go")
    runs.run_process_queued(run_uuid=queued.uuid)
    run = AgentRun.objects.get(pk=queued.pk)
    if run.status == Status.WAITING_FOR_APPROVAL:
        runs.run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            approved=True,
            turn_digest=run.pending_turn["turn_digest"],
            mode="queued",
        )
        runs.run_process_queued(run_uuid=run.uuid)
    return AgentRun.objects.get(pk=queued.pk)


def the_tool_event(run: AgentRun) -> dict[str, Any]:
    (tool,) = [e.payload for e in events(run) if e.kind == EventKind.TOOL]
    return tool


def assert_ran_once_and_completed(run: AgentRun, hostile: Hostile, name: str) -> dict[str, Any]:
    """Completed after one execution (one note for the write), nothing left held, nothing in
    doubt, never reaped; the model read what is stored; the ledger verifies. The tool event."""
    assert (run.status, run.termination_reason, run.output) == (
        Status.COMPLETED,
        TerminationReason.COMPLETED,
        "done",
    ), run.error
    assert [ran[0] for ran in hostile.ran] == [name]
    assert Note.objects.count() == (1 if name == "hostile_write" else 0)
    stream = assert_contiguous(run)
    assert not {EventKind.IN_DOUBT, EventKind.REAPER, EventKind.ERROR} & {e.kind for e in stream}
    assert run.requeue_count == 0
    assert_released(run)
    tool = the_tool_event(run)
    assert tool["outcome"] == "executed"
    # The model's next request carries the tool message derived from what is stored.
    last_request = sent(run)[-1]
    assert tool_messages(last_request)[tool["call_id"]] == tool_message_content(tool)
    assert audit.verify(run_uuid=run.uuid).intact
    return tool


# --- results mended and marked ------------------------------------------------------------------

RESULTS: dict[str, tuple[Callable[[], Any], Callable[[Any], bool], list[str]]] = {
    "nul": (
        lambda: {"text": "a\x00b", "k\x00": "key"},
        lambda stored: stored == {"text": f"a{R}b", f"k{R}": "key"},
        ["text"],
    ),
    "surrogate": (
        lambda: {"text": "\ud800 and \udfff", "list": ["\udc00"]},
        lambda stored: stored == {"text": f"{R} and {R}", "list": [R]},
        ["text"],
    ),
    "nan": (
        lambda: {"n": math.nan, "more": [math.inf, -math.inf, 1.5]},
        lambda stored: stored == {"n": "NaN", "more": ["Infinity", "-Infinity", 1.5]},
        ["number"],
    ),
    "nul-and-nan": (
        lambda: ["\x00", math.nan],
        lambda stored: stored == [R, "NaN"],
        ["text", "number"],
    ),
    "deep": (
        lambda: nested(MAX_RESULT_DEPTH + 40),
        lambda stored: (
            depth_of(stored) == MAX_RESULT_DEPTH
            and f"[cut: nested deeper than {MAX_RESULT_DEPTH} levels]" in json.dumps(stored)
        ),
        ["depth"],
    ),
    "huge": (
        lambda: {"text": "x" * (2 * MAX_RESULT_CHARS)},
        lambda stored: (
            isinstance(stored, str)
            and stored.startswith('{"text":"xxxx')
            and stored.endswith(
                f"[cut for storage: {2 * MAX_RESULT_CHARS + 11:,} characters of JSON; "
                "the beginning is kept]"
            )
            and len(json.dumps(stored, ensure_ascii=False)) <= MAX_RESULT_CHARS
        ),
        ["size"],
    ),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("case", list(RESULTS))
def test_a_result_no_column_can_store_is_mended_marked_and_the_run_goes_on(
    hostile, scripted_recordings, case, name, path
):
    returns, as_stored, marks = RESULTS[case]
    hostile.returns = returns

    run = run_to_the_end(name, path)

    tool = assert_ran_once_and_completed(run, hostile, name)
    assert tool["ok"] is True and tool["error"] == ""
    assert as_stored(tool["result"]), str(tool["result"])[:300]
    assert tool["normalised"] == marks
    assert json.loads(tool_message_content(tool)) == tool["result"]


def test_the_playground_trace_says_the_result_was_altered_for_storage(hostile, scripted_recordings):
    hostile.returns = lambda: {"text": "a\x00b", "n": math.nan}
    run = run_to_the_end("hostile_read", "sync")

    steps = trace.stored_steps(run, events(run))

    (shown,) = [trace.render_step(s) for s in steps if s["kind"] == EventKind.TOOL]
    assert "Altered so that it could be stored: text, number" in shown


def test_a_clean_result_is_not_marked(hostile, scripted_recordings):
    hostile.returns = lambda: {"text": "plain é 😀", "n": 1.5}

    run = run_to_the_end("hostile_read", "sync")

    tool = assert_ran_once_and_completed(run, hostile, "hostile_read")
    assert tool["result"] == {"text": "plain é 😀", "n": 1.5}
    assert "normalised" not in tool


# --- errors: mended, or saying the tool ran -----------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("hostile __str__")


ERRORS: dict[str, tuple[Hostile, str, list[str] | None]] = {
    "raised-nul": (
        Hostile(raises=lambda: RuntimeError("disk \x00 full \ud800")),
        f"RuntimeError: disk {R} full {R}",
        ["text"],
    ),
    "raised-unprintable": (
        Hostile(raises=Unprintable),
        "Unprintable: (its message could not be read: RuntimeError)",
        None,
    ),
    "bytes": (
        Hostile(returns=lambda: {"body": b"\x00\xff"}),
        "tool '{name}' ran, but returned what JSON cannot hold: a value of type 'bytes' at $.body",
        None,
    ),
    "object": (
        Hostile(returns=object),
        "tool '{name}' ran, but returned what JSON cannot hold: a value of type 'object' at $",
        None,
    ),
}


def circular() -> Any:
    loop: dict[str, Any] = {"n": math.nan}
    loop["self"] = [loop]
    return loop


ERRORS["circular"] = (
    Hostile(returns=circular),
    "tool '{name}' ran, but returned what JSON cannot hold: a structure inside itself at $.self[0]",
    None,
)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", TOOLS)
@pytest.mark.parametrize("case", list(ERRORS))
def test_an_unstorable_error_or_a_value_json_cannot_hold_is_an_error_the_model_reads(
    hostile, scripted_recordings, case, name, path
):
    behaviour, error, marks = ERRORS[case]
    hostile.returns, hostile.raises = behaviour.returns, behaviour.raises

    run = run_to_the_end(name, path)

    tool = assert_ran_once_and_completed(run, hostile, name)
    assert (tool["ok"], tool["result"]) == (False, None)
    assert tool["error"] == error.format(name=name)
    assert tool.get("normalised") == marks
    assert json.loads(tool_message_content(tool)) == {"error": tool["error"]}


# --- the crash gap: the process dies after the tool returned, before anything is written -------


class ProcessDied(BaseException):
    """Stands for the process vanishing: nothing in the runtime catches it."""


def test_a_write_whose_process_dies_while_its_result_is_mended_is_in_doubt_never_rerun(
    hostile, monkeypatch
):
    """The worst gap: the write has landed and the process dies while its result is made
    storable (or at any point before the boundary writes it). Nothing of the result was
    written; the reaper finds the fence of a non-idempotent write and parks the run in doubt,
    as for a crash inside the call. A person says it landed: the run completes, the write ran
    once."""
    hostile.returns = lambda: {"text": "a\x00b", "n": math.nan}
    mend_json = invocation.mend_json

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise ProcessDied()

    monkeypatch.setattr(invocation, "mend_json", dies)
    configuration = config(
        tools=TOOLS, script=[tool_turn(call("hostile_write")), {"content": "done"}]
    )
    run = runs.run_start_sync(configuration=configuration, prompt="go").run
    assert run.status == Status.WAITING_FOR_APPROVAL
    with pytest.raises(ProcessDied):
        decide_inline(run)
    monkeypatch.setattr(invocation, "mend_json", mend_json)

    run.refresh_from_db()
    assert (run.status, run.pending_effect) == (Status.RUNNING, Effect.NON_IDEMPOTENT_WRITE)
    assert not [e for e in events(run) if e.kind == EventKind.TOOL]
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    verdicts = reaper.reap_stale_runs(redispatch=False)
    assert verdicts.count(reaper.Verdict.IN_DOUBT) == 1
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION

    runs.run_reconcile(
        run_uuid=run.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=card_digest(run),  # the digest a person is shown and sends
        mode="inline",
    )

    run.refresh_from_db()
    assert (run.status, run.output) == (Status.COMPLETED, "done")
    assert [ran[0] for ran in hostile.ran] == ["hostile_write"]
    assert Note.objects.count() == 1
    assert_released(run)
    assert audit.verify(run_uuid=run.uuid).intact


def test_a_read_whose_process_dies_while_its_result_is_mended_runs_again_and_is_stored_mended(
    hostile, monkeypatch
):
    """The same gap for a read: no fence, so the reaper requeues the run and the next segment
    runs the read again (reads may run twice), this time storing its result mended."""
    hostile.returns = lambda: {"text": "a\x00b"}
    mend_json = invocation.mend_json

    def dies_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(invocation, "mend_json", mend_json)
        raise ProcessDied()

    monkeypatch.setattr(invocation, "mend_json", dies_once)
    configuration = config(
        tools=TOOLS, script=[tool_turn(call("hostile_read")), {"content": "done"}]
    )
    queued = runs.run_enqueue(configuration=configuration, prompt="go")
    with pytest.raises(ProcessDied):
        runs.run_process_queued(run_uuid=queued.uuid)
    AgentRun.objects.filter(pk=queued.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs(redispatch=False).count(reaper.Verdict.REQUEUED) == 1
    runs.run_process_queued(run_uuid=queued.uuid)

    run = AgentRun.objects.get(pk=queued.pk)
    assert (run.status, run.output) == (Status.COMPLETED, "done")
    assert [ran[0] for ran in hostile.ran] == ["hostile_read", "hostile_read"]
    tool = the_tool_event(run)
    assert (tool["result"], tool["normalised"]) == ({"text": f"a{R}b"}, ["text"])
    assert_released(run)
    assert audit.verify(run_uuid=run.uuid).intact


# --- previews and check answers -----------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_preview_no_column_can_store_is_mended_marked_and_still_holds(
    hostile, scripted_recordings, path
):
    """The preview is stored with the turn waiting for approval (and digested): mended and
    marked, and made again before the approved write runs, it still shows what was approved."""
    hostile.returns = lambda: {"ok": True}
    configuration = config(
        tools=ALL_TOOLS, script=[tool_turn(call("hostile_previewed")), {"content": "done"}]
    )
    waiting = runs.run_start_sync(configuration=configuration, prompt="go").run
    assert waiting.status == Status.WAITING_FOR_APPROVAL
    (shown,) = waiting.pending_turn["calls"]
    assert shown["preview"] == {
        "summary": f"creates a note {R}",
        "target": f"notes{R}",
        "changes": [{"field": f"title{R}", "before": "NaN", "after": {"t": R}}],
        "normalised": ["text", "number"],
    }
    assert hostile.ran == []

    if path == "sync":
        decide_inline(waiting)
    else:
        runs.run_decide(
            run_uuid=waiting.uuid,
            actor=decider(),
            approved=True,
            turn_digest=waiting.pending_turn["turn_digest"],
            mode="queued",
        )
        runs.run_process_queued(run_uuid=waiting.uuid)

    run = AgentRun.objects.get(pk=waiting.pk)
    assert not [e for e in events(run) if e.kind == EventKind.VERIFICATION]
    tool = assert_ran_once_and_completed(run, hostile, "hostile_write")
    assert (tool["name"], tool["result"]) == ("hostile_previewed", {"ok": True})


def doubtful_run(hostile: Hostile) -> AgentRun:
    """A run whose approved write landed and then could not tell: waiting for its check."""
    configuration = config(
        tools=ALL_TOOLS, script=[tool_turn(call("hostile_doubtful")), {"content": "done"}]
    )
    waiting = runs.run_start_sync(configuration=configuration, prompt="go").run
    run = decide_inline(waiting).run
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert [ran[0] for ran in hostile.ran] == ["hostile_write"]
    return run


def test_a_check_s_answer_no_column_can_store_is_mended_and_marked(hostile, scripted_recordings):
    hostile.answer = lambda: CheckAnswer.landed(
        "found note \x00 by its key", result={"id": "a\ud800", "n": math.nan}
    )
    run = doubtful_run(hostile)

    assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "landed"
    runs.run_process_queued(run_uuid=run.uuid)

    run.refresh_from_db()
    assert (run.status, run.output) == (Status.COMPLETED, "done")
    (verdict,) = [e.payload for e in events(run) if e.kind == EventKind.RECONCILIATION]
    assert verdict["evidence"] == f"found note {R} by its key"
    assert verdict["result"] == {"id": f"a{R}", "n": "NaN"}
    assert verdict["normalised"] == ["text", "number"]
    (tool,) = [e.payload for e in events(run) if e.kind == EventKind.TOOL]
    assert tool["outcome"] == "reconciled_landed"
    assert tool["result"]["result"] == {"id": f"a{R}", "n": "NaN"}
    assert [ran[0] for ran in hostile.ran] == ["hostile_write"]  # never run again
    assert Note.objects.count() == 1
    assert_released(run)
    assert audit.verify(run_uuid=run.uuid).intact


def test_a_check_s_result_json_cannot_hold_is_an_error_answer_and_takes_no_verdict(hostile):
    hostile.answer = lambda: CheckAnswer.landed("found it", result={"raw": b"\x00"})
    run = doubtful_run(hostile)

    answered = reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1)

    assert answered == "error: retrying"
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    (noted,) = [e.payload for e in events(run) if e.kind == EventKind.CHECK]
    assert noted["answer"] == "error"
    assert noted["evidence"] == (
        "it answered landed, with a result JSON cannot hold: a value of type 'bytes' at $.raw"
    )
    assert not [e for e in events(run) if e.kind == EventKind.RECONCILIATION]
    assert [ran[0] for ran in hostile.ran] == ["hostile_write"]
