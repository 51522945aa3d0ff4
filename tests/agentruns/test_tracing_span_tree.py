"""The spans of a whole run (agentruns/tracing.py; docs/design.md §6.9), exported by the SDK's
in-memory exporter: a run with an approval, a process that dies inside an approved write, the
reaper's verdict, a person's reconciliation and the continuation are one trace, every segment,
decision, verdict and in-doubt span a child of the run span stored on the row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.urls import reverse
from opentelemetry.trace import StatusCode

from agentruns.models import AgentRun, Status
from agentruns.services import reaper
from agentruns.services.reaper import Verdict
from agentruns.services.runs import (
    run_decide,
    run_enqueue,
    run_process_queued,
    run_reconcile,
    run_start_sync,
)
from agentruns.services.runtime.results import Outcome
from agentruns.tools.shown import shown_turn
from agentruns.turns import read_pending_turn
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.runtime import call, config, decider, tool_turn
from tests.agentruns.support.tracing import Spans, hex_span, hex_trace

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("scripted_recordings"),
]

USAGE = {"prompt_tokens": 11, "completion_tokens": 7}


def dies_in_probe_create(entry: dict[str, Any]) -> None:
    if entry["tool"] == "probe_create":
        raise ProcessDied()


def approved_crashed_and_reconciled(probes: Any) -> AgentRun:
    """Start a run that waits for approval of two writes; approve it inline; the process dies
    inside the second (non-idempotent) write; the reaper parks it in doubt; a person says it
    landed, inline; the continuation completes."""
    started = run_start_sync(
        configuration=config(),
        prompt="go",
        options={
            "script": [
                tool_turn(
                    call("probe_write", value="first"),
                    call("probe_create", value="second"),
                    usage=USAGE,
                ),
                {"content": "finished", "usage": USAGE},
            ]
        },
    )
    assert started.outcome == Outcome.AWAITING_APPROVAL
    run = started.run
    probes.during = dies_in_probe_create
    with pytest.raises(ProcessDied):
        run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            approved=True,
            turn_digest=run.pending_turn["turn_digest"],
            mode="inline",
        )
    probes.during = None
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs().count(Verdict.IN_DOUBT) == 1
    row = AgentRun.objects.get(pk=run.pk)
    run_reconcile(
        run_uuid=run.uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=shown_turn(row, read_pending_turn(row)).turn_digest,
        mode="inline",
    )
    row.refresh_from_db()
    assert row.status == Status.COMPLETED
    return row


def test_a_run_with_an_approval_a_crash_and_a_continuation_is_one_trace(probes, spans: Spans):
    run = approved_crashed_and_reconciled(probes)

    root = spans.one("leasehold.run")
    assert root.parent is None
    assert (hex_trace(root), hex_span(root)) == (run.trace_id, run.trace_span_id)
    assert root.attributes["leasehold.run.uuid"] == str(run.uuid)
    assert root.attributes["leasehold.run.mode"] == "sync"
    assert {hex_trace(span) for span in spans.all()} == {run.trace_id}

    # Segments, decisions, the reaper's verdict and the doubt: children of the run span, rebuilt
    # from the row in each place (a remote parent), in the order they happened.
    children = sorted(spans.children(root), key=lambda span: span.start_time or 0)
    assert [span.name for span in children] == [
        "leasehold.segment",
        "leasehold.decision",
        "leasehold.segment",
        "leasehold.reaper.verdict",
        "leasehold.in_doubt",
        "leasehold.decision",
        "leasehold.segment",
    ]
    assert all(span.parent is not None and span.parent.is_remote for span in children)
    first, approval, died, verdict, doubt, reconciled, last = children

    assert first.attributes["leasehold.lease.owner"].startswith("interactive:")
    assert first.attributes["leasehold.lease.epoch"] == 1
    assert first.attributes["leasehold.segment.outcome"] == Outcome.AWAITING_APPROVAL
    assert approval.attributes["leasehold.decision.kind"] == "approval"
    assert approval.attributes["leasehold.decision.approved"] is True
    assert approval.attributes["leasehold.decision.mode"] == "inline"
    assert died.attributes["leasehold.segment.kind"] == "resume"
    assert died.attributes["leasehold.lease.epoch"] == 2
    # In this process the crash point unwinds the block: the span ends in error, by class
    # name. (A real process that dies exports nothing more of its segment.)
    assert died.status.status_code == StatusCode.ERROR
    assert died.attributes["error.type"] == "ProcessDied"
    assert verdict.attributes["leasehold.reaper.rule"] == "fence"
    assert verdict.attributes["leasehold.reaper.verdict"] == Verdict.IN_DOUBT
    assert verdict.attributes["leasehold.lease.owner"].startswith("resume:")
    assert verdict.attributes["leasehold.lease.epoch"] == 2
    assert doubt.attributes["leasehold.in_doubt.by"] == "reaper"
    assert doubt.attributes["gen_ai.tool.name"] == "probe_create"
    assert reconciled.attributes["leasehold.decision.kind"] == "reconciliation"
    assert reconciled.attributes["leasehold.decision.verdict"] == "landed"
    assert last.attributes["leasehold.lease.epoch"] == 3
    assert last.attributes["leasehold.segment.outcome"] == Outcome.COMPLETED

    # Model calls: children of their segment, with the GenAI conventions' attributes.
    (proposed,) = spans.children(first)
    (answered,) = spans.children(last)
    for span, reason in ((proposed, "tool_calls"), (answered, "stop")):
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == "leasehold.scripted"
        assert span.attributes["gen_ai.system"] == "leasehold.scripted"
        assert span.attributes["gen_ai.usage.input_tokens"] == 11
        assert span.attributes["gen_ai.usage.output_tokens"] == 7
        assert span.attributes["gen_ai.response.finish_reasons"] == (reason,)

    # Tool calls: children of the segment that ran them; the one the process died in ended
    # with it.
    write, create = sorted(spans.children(died), key=lambda span: span.start_time or 0)
    assert write.name == "execute_tool probe_write"
    assert write.attributes["leasehold.tool.effect"] == "idempotent_write"
    assert write.attributes["leasehold.tool.fenced"] is True
    assert write.attributes["leasehold.tool.outcome"] == "executed"
    assert write.attributes["leasehold.tool.idempotency_key"] == f"{run.uuid}:call_0_0"
    assert create.name == "execute_tool probe_create"
    assert create.attributes["leasehold.tool.idempotency_key"] == f"{run.uuid}:call_0_1"
    assert create.attributes["error.type"] == "ProcessDied"
    assert "leasehold.tool.outcome" not in create.attributes


def test_a_queued_run_and_its_worker_share_the_runs_trace(spans: Spans):
    run = run_enqueue(configuration=config(), prompt="go", options={"script": [{"content": "ok"}]})
    assert run.trace_id and run.trace_span_id
    run_process_queued(run_uuid=run.uuid)

    root = spans.one("leasehold.run")
    assert root.attributes["leasehold.run.mode"] == "queued"
    (segment,) = spans.children(root)
    assert segment.attributes["leasehold.segment.kind"] == "worker"
    assert segment.attributes["leasehold.segment.outcome"] == Outcome.COMPLETED
    assert hex_trace(segment) == run.trace_id


def test_the_timeline_shows_the_trace_id_escaped(client, spans: Spans):
    started = run_start_sync(
        configuration=config(), prompt="go", options={"script": [{"content": "ok"}]}
    )
    run = started.run
    staff = decider(is_staff=True, is_superuser=True)
    client.force_login(staff)
    html = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert f'<code class="approvals-trace-id">{run.trace_id}</code>' in html

    AgentRun.objects.filter(pk=run.pk).update(trace_id="<b>x</b>")
    html = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
