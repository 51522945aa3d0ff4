"""``agentruns.tracing`` (docs/design.md §6.9): nothing recorded, stored or raised without a tracer
provider or without the package; no content on a span unless ``OTEL_CAPTURE_CONTENT`` is on; a
run the sampler dropped stays dropped in every later segment; a run born untraced gets a trace
per segment. The span tree of a whole run is ``test_tracing_span_tree.py``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from agentruns import tracing
from agentruns.conf import app_settings, settings_from_env
from agentruns.models import AgentRun
from agentruns.services.runs import run_enqueue, run_process_queued, run_start_sync
from agentruns.services.runtime.results import Outcome
from tests.agentruns.support.runtime import call, config, tool_turn
from tests.agentruns.support.tracing import Spans, install, uninstall

pytestmark = pytest.mark.django_db

SECRET = "sk-live-7d1e9c0ffee-SECRET"


def hostile_run() -> AgentRun:
    """A run whose prompt, tool arguments, tool result and answer all carry ``SECRET``, and one
    of whose calls fails with it in its error."""
    result = run_start_sync(
        configuration=config(),
        prompt=f"use the key {SECRET}",
        options={
            "script": [
                tool_turn(
                    call("probe_read", value=f"<script>{SECRET}</script>"),
                    call("probe_raises", value=SECRET),
                ),
                {"content": f"done with {SECRET}"},
            ]
        },
    )
    assert result.outcome == Outcome.COMPLETED
    return result.run


def test_without_a_tracer_provider_nothing_is_recorded_or_stored():
    assert not tracing.enabled()
    run = run_start_sync(
        configuration=config(), prompt="go", options={"script": [{"content": "ok"}]}
    ).run
    assert (run.trace_id, run.trace_span_id) == ("", "")
    assert (
        tracing.run_born(
            run_uuid=run.uuid, configuration="c", initiator_id=None, mode="sync", prompt="p"
        )
        == {}
    )


def test_without_the_package_every_span_is_a_no_op():
    """``opentelemetry`` not importable (the extra not installed): the module imports, stores
    nothing and its spans do nothing."""
    script = textwrap.dedent(
        """
        import sys, types
        sys.modules["opentelemetry"] = None
        from agentruns import tracing
        assert tracing._otel is None and not tracing.enabled()
        assert tracing.run_born(
            run_uuid="u", configuration="c", initiator_id=None, mode="sync", prompt="p"
        ) == {}
        run = types.SimpleNamespace(uuid="u", trace_id="ab" * 16, trace_span_id="cd" * 8)
        with tracing.segment(run, owner="worker:h:1", epoch=2) as span:
            with tracing.model_call(
                provider="openai", model="m", max_tokens=None, messages=[], final=False
            ) as call:
                tracing.model_reply(call, RuntimeError("x"))
            with tracing.tool_call(
                name="t", call_id="c", effect="read", idempotency_key="k", arguments={}
            ) as tool:
                tracing.tool_outcome(tool, outcome="executed", fenced=False, ok=True)
            span.set(a=1)
        tracing.decision(run, kind="approval", payload={}, actor_id=None)
        tracing.in_doubt(run, by="segment", call_name="t")
        assert not span.recording
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_no_prompt_argument_result_answer_or_error_text_is_on_a_span_by_default(
    probes, spans: Spans
):
    hostile_run()
    names = {span.name for span in spans.all()}
    assert {"leasehold.run", "leasehold.segment", "execute_tool probe_read"} <= names
    assert "execute_tool probe_raises" in names and "chat" in names
    assert not any(SECRET in str(value) for value in spans.attribute_values())
    assert not any(SECRET in span.name for span in spans.all())
    assert not any(SECRET in (span.status.description or "") for span in spans.all())
    raised = spans.one("execute_tool probe_raises")
    assert raised.attributes["error.type"] == "tool_error"


def test_with_content_capture_on_the_content_is_recorded(probes, spans: Spans):
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "OTEL_CAPTURE_CONTENT": True}):
        hostile_run()
    read = spans.one("execute_tool probe_read")
    assert SECRET in read.attributes["gen_ai.tool.call.arguments"]
    assert SECRET in read.attributes["gen_ai.tool.call.result"]
    assert SECRET in spans.one("leasehold.run").attributes["leasehold.run.prompt"]
    first, last = sorted(spans.named("chat"), key=lambda span: span.start_time or 0)
    assert SECRET in first.attributes["gen_ai.input.messages"]
    assert SECRET in last.attributes["gen_ai.output.messages"]


def test_the_setting_is_off_by_default_and_read_from_the_environment():
    assert app_settings().otel_capture_content is False
    assert settings_from_env({})["OTEL_CAPTURE_CONTENT"] is False
    assert settings_from_env({"AGENTRUNS_OTEL_CAPTURE_CONTENT": "on"})["OTEL_CAPTURE_CONTENT"]


def test_a_run_the_sampler_dropped_records_no_span_in_any_later_segment():
    provider, exporter = install(sampler=ParentBased(ALWAYS_OFF))
    try:
        run = run_enqueue(
            configuration=config(), prompt="go", options={"script": [{"content": "ok"}]}
        )
        assert len(run.trace_id) == 32 and run.trace_span_id == ""
        run_process_queued(run_uuid=run.uuid)
        assert exporter.get_finished_spans() == ()
    finally:
        uninstall(provider)


def test_a_run_born_untraced_gets_a_trace_of_its_own_per_segment(spans_later: Any):
    run = run_enqueue(configuration=config(), prompt="go", options={"script": [{"content": "ok"}]})
    assert run.trace_id == ""
    spans = spans_later()
    run_process_queued(run_uuid=run.uuid)
    (segment,) = spans.named("leasehold.segment")
    assert segment.parent is None
    assert AgentRun.objects.get(pk=run.pk).trace_id == ""  # nothing is written afterwards


@pytest.fixture
def spans_later():
    """Install the provider when the test says so (after a run was born without one)."""
    installed: list[Any] = []

    def start() -> Spans:
        provider, exporter = install()
        installed.append(provider)
        return Spans(exporter)

    yield start
    for provider in installed:
        uninstall(provider)


def test_the_run_span_starts_its_own_trace_linked_to_the_span_current_at_its_start(
    spans: Spans,
):
    from opentelemetry import trace

    with trace.get_tracer("the-host").start_as_current_span("POST /api/runs/") as request:
        run = run_enqueue(
            configuration=config(), prompt="go", options={"script": [{"content": "ok"}]}
        )
    root = spans.one("leasehold.run")
    assert root.parent is None
    assert root.context.trace_id != request.get_span_context().trace_id
    assert [link.context.span_id for link in root.links] == [request.get_span_context().span_id]
    assert format(root.context.trace_id, "032x") == run.trace_id


def test_a_deadline_that_decides_is_a_decision_span_in_the_runs_trace(probes, spans: Spans):
    from agentruns.services import reaper
    from tests.agentruns.support.deadlines import AT_ONCE, waiting_for_approval

    run = waiting_for_approval(timeout=AT_ONCE, action="deny")
    reaper.reap_stale_runs()
    run_process_queued(run_uuid=run.uuid)

    root = spans.one("leasehold.run")
    deadline = spans.one("leasehold.decision")
    assert deadline.parent is not None and deadline.parent.span_id == root.context.span_id
    assert deadline.attributes["leasehold.decision.kind"] == "deadline"
    assert deadline.attributes["leasehold.decision.by"] == "deadline"
    assert deadline.attributes["leasehold.decision.verdict"] == "deny"
    assert [
        s.attributes["leasehold.segment.outcome"] for s in spans.named("leasehold.segment")
    ] == [
        Outcome.AWAITING_APPROVAL,
        Outcome.COMPLETED,
    ]
