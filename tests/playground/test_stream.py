"""The streamed playground: NDJSON lines as events are recorded, one terminal line, and a client
that goes away mid-stream leaves its run settled ``abandoned`` with the lease released.

The segment runs in a background thread with its own connection: these tests commit
(``transaction=True``) and read the streaming body incrementally, line by line.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import pytest

from agentruns import transitions
from agentruns.identity import execution_identity
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status, TerminationReason
from playground.models import Note
from playground.stream import RunStream
from tests.agentruns.support.api import (
    APPROVAL_SCRIPT,
    WEBHOOK_SCRIPT,
    config,
    digest,
    waiting_for_approval,
    waiting_for_input,
)
from tests.playground.conftest import join_streams

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _segments_stop():
    yield
    join_streams()


def lines(response) -> Iterator[dict]:
    for chunk in response.streaming_content:
        for line in chunk.decode().splitlines():
            yield json.loads(line)


def stream(client, **data):
    response = client.post("/playground/stream/", data)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["X-Accel-Buffering"] == "no"
    return response


def test_steps_stream_in_order_then_exactly_one_terminal_line(dev_client):
    config(
        "reader",
        [{"tool_calls": [{"name": "list_notes", "arguments": {}}]}, {"content": "no notes"}],
    )
    received = list(lines(stream(dev_client, configuration="reader", prompt="count")))
    run = AgentRun.objects.get()
    assert [line["event"] for line in received] == ["step"] * 6 + ["end"]
    steps = received[:-1]
    assert [s["kind"] for s in steps] == ["lease", "request", "llm", "tool", "request", "llm"]
    assert {s["run"] for s in steps} == {str(run.uuid)}
    # The stream carries exactly the recorded events, in their recorded order (the claim at
    # birth too: the streamed and the reloaded trace show the same steps).
    recorded = [e.kind for e in AgentRunEvent.objects.filter(run=run).order_by("sequence")]
    assert recorded == [s["kind"] for s in steps]
    assert "claimed when the run started" in steps[0]["html"]
    assert 'data-kind="tool"' in steps[3]["html"] and "list_notes" in steps[3]["html"]
    assert "Read" in steps[3]["html"] and "read_only" not in steps[3]["html"]
    assert steps[1]["payload"]["messages"][-1] == {"role": "user", "content": "count"}
    end = received[-1]
    assert end["outcome"] == "completed" and end["status"] == "completed"
    assert end["output"] == "no notes"
    assert end["url"] == f"/playground/runs/{run.uuid}/"


def test_the_first_step_arrives_before_the_provider_answers(dev_client):
    config("slow", [{"content": "finally", "delay": 1.0}])
    body = lines(stream(dev_client, configuration="slow", prompt="wait for it"))
    assert next(body)["kind"] == "lease"  # claimed at birth
    first = next(body)
    assert first["event"] == "step" and first["kind"] == "request"
    run = AgentRun.objects.get(uuid=first["run"])
    # The provider is still sleeping: no answer recorded, the run still running.
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.LLM).exists()
    assert run.status == Status.RUNNING
    rest = list(body)
    assert [line.get("kind", line["event"]) for line in rest] == ["llm", "end"]
    assert rest[-1]["output"] == "finally"


def test_a_client_that_goes_away_leaves_the_run_abandoned(dev_client):
    config("slow", [{"content": "too late", "delay": 1.0}])
    response = stream(dev_client, configuration="slow", prompt="p")
    first = json.loads(next(response.streaming_content))
    assert first["kind"] == "lease"  # the run exists, claimed at birth
    response.close()  # what the WSGI server does when the client disconnects

    run = AgentRun.objects.get(uuid=first["run"])
    assert run.status == Status.FAILED
    assert run.termination_reason == TerminationReason.ABANDONED
    assert run.claimed_by == "" and run.lease_expires is None
    join_streams()
    # The segment stopped at its next boundary: its answer was never recorded, and nothing
    # changed the settled run after it.
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.termination_reason == TerminationReason.ABANDONED
    kinds = list(run.events.order_by("sequence").values_list("kind", "payload__action"))
    assert kinds[-1] == (EventKind.LEASE, "abandoned")
    assert not run.events.filter(kind=EventKind.LLM).exists()


def test_a_stream_closed_before_it_started_creates_no_run(dev_client):
    config("hello", [{"content": "hi"}])
    stream(dev_client, configuration="hello", prompt="p").close()
    assert not AgentRun.objects.exists()


def test_an_invalid_form_is_one_error_line_with_400(dev_client):
    response = dev_client.post("/playground/stream/", {"configuration": "nope", "prompt": ""})
    assert response.status_code == 400
    (line,) = [json.loads(x) for x in response.content.decode().splitlines()]
    assert line["event"] == "error" and line["code"] == "invalid_request"
    assert set(line["errors"]) == {"configuration", "prompt"}


def test_a_streamed_approval_continues_inline(dev_client):
    run = waiting_for_approval()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/",
        {"approved": "1", "turn_digest": digest(run)},
    )
    received = list(lines(response))
    assert [line.get("kind", line["event"]) for line in received] == [
        "approval",
        "tool",
        "request",
        "llm",
        "end",
    ]
    assert "Approved</strong> by dev" in received[0]["html"]
    assert received[1]["payload"]["outcome"] == "executed"
    assert received[-1]["status"] == "completed"
    assert Note.objects.count() == 1


def _kinds(html: str) -> list[str]:
    return re.findall(r'data-kind="([a-z_]+)"', html)


def test_a_streamed_denial_shows_who_denied_and_the_same_steps_as_the_reloaded_trace(dev_client):
    first = list(
        lines(
            stream(
                dev_client,
                configuration=config("denied", APPROVAL_SCRIPT).slug,
                prompt="make a note",
            )
        )
    )
    run = AgentRun.objects.get()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/",
        {"approved": "0", "turn_digest": digest(run)},
    )
    second = list(lines(response))
    streamed = [s for s in first + second if s["event"] == "step"]
    assert streamed[len(first) - 1]["kind"] == "approval"
    assert "Denied</strong> by dev" in streamed[len(first) - 1]["html"]
    denied = [s for s in streamed if s["kind"] == "tool"]
    assert denied and "denied, did not run" in denied[0]["html"]
    # The end line says the outcome once, in words, and updates the recent runs.
    end = second[-1]
    assert end["outcome_label"] == "finished" and "completed · completed" not in end["html"]
    assert f'data-run="{run.uuid}"' in end["history_html"]
    # The reloaded trace shows exactly the streamed steps.
    page = dev_client.get(f"/playground/runs/{run.uuid}/").content.decode()
    trace = page[page.index('id="trace"') : page.index('id="outcome"')]
    assert _kinds(trace) == [s["kind"] for s in streamed]
    assert "Denied</strong> by dev" in trace


def test_a_streamed_decision_that_is_refused_is_one_error_line(dev_client):
    run = waiting_for_approval()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/", {"approved": "1", "turn_digest": "x"}
    )
    assert [line for line in lines(response)] == [
        {
            "event": "error",
            "code": "stale_turn",
            "message": "The pending action changed — review again.",
        }
    ]
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_a_streamed_approval_without_the_tool_s_permission_is_one_error_line_naming_it(
    dev_client, developer
):
    run = waiting_for_approval(developer, script=WEBHOOK_SCRIPT)
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/",
        {"approved": "1", "turn_digest": digest(run)},
    )
    assert [line for line in lines(response)] == [
        {
            "event": "error",
            "code": "not_permitted",
            "message": "approving call_webhook needs playground.approve_webhooks",
        }
    ]
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_a_streamed_run_that_suspends_ends_with_the_decision_form(dev_client):
    config("notes", APPROVAL_SCRIPT)
    received = list(lines(stream(dev_client, configuration="notes", prompt="note it")))
    end = received[-1]
    assert end["event"] == "end" and end["outcome"] == "awaiting_approval"
    assert 'name="decision" value="approve"' in end["html"]
    assert "csrfmiddlewaretoken" in end["html"]


# --- The abandon never cuts off a write in flight ----------------------------------------------


def test_an_abandon_refused_by_the_fence_happens_at_the_next_boundary(developer):
    """Client gone while a write is fenced: the run is settled only after the write's boundary."""
    configuration = config("hello", [{"content": "hi"}])
    closed = threading.Event()
    observed: list[bool] = []

    def fake_segment(*, observer, on_claim):
        lease = transitions.run_start(
            configuration=configuration,
            initiator_id=developer.pk,
            prompt="p",
            request={"prompt": "p"},
            identity=execution_identity("interactive"),
        )
        on_claim(lease)
        assert transitions.run_heartbeat(lease, events=[EventSpec(EventKind.REQUEST, {})])
        call = {"id": "c1", "name": "update_note", "arguments": {}}
        assert transitions.run_stamp_fence(lease, effect="idempotent_write", call=call)
        observer(EventSpec(EventKind.REQUEST, {}))  # the client reads this line, then leaves
        assert closed.wait(10)
        # The write "runs" here; the client's abandon was refused meanwhile.
        observed.append(AgentRun.objects.get(pk=lease.run_id).status == Status.RUNNING)
        tool = EventSpec(EventKind.TOOL, {"call_id": "c1", "name": "update_note"})
        assert transitions.run_clear_fence(lease, events=[tool])
        observer(tool)  # abandons now
        still_mine = transitions.run_heartbeat(lease)
        observed.append(still_mine)
        from agentruns.services.runtime.results import Outcome, SegmentResult

        return SegmentResult(Outcome.LEASE_LOST, AgentRun.objects.get(pk=lease.run_id))

    body = RunStream(
        fake_segment,
        step_line=lambda spec, run: {"kind": spec.kind, "run": run},
        end_line=lambda result: {"outcome": result.outcome},
        error_line=lambda exc: {"message": str(exc)},
    )
    first = json.loads(next(body))
    body.close()
    closed.set()
    body.thread.join(10)
    run = AgentRun.objects.get(uuid=first["run"])
    assert observed == [True, False]  # fenced: not abandoned; after the boundary: lease lost
    assert run.status == Status.FAILED and run.termination_reason == TerminationReason.ABANDONED
    assert list(run.events.order_by("sequence").values_list("kind", flat=True))[-2:] == [
        EventKind.TOOL,
        EventKind.LEASE,
    ]


def test_run_abandon_is_guarded_by_the_lease(developer):
    configuration = config("hello", [{"content": "hi"}])
    lease = transitions.run_start(
        configuration=configuration,
        initiator_id=None,
        prompt="p",
        request={"prompt": "p"},
        identity="interactive:h:1",
    )
    stale = Lease(lease.run_id, lease.uuid, lease.owner, lease.epoch + 1, 0)
    assert transitions.run_abandon(stale) is False
    assert transitions.run_abandon(lease) is True
    assert transitions.run_abandon(lease) is False  # terminal is terminal
    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.FAILED and run.termination_reason == "abandoned"
    assert run.events.filter(kind=EventKind.LEASE, payload__action="abandoned").count() == 1


def test_streamed_input_values_the_form_refuses_are_one_error_line_with_the_form(dev_client):
    run = waiting_for_input()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/input/stream/",
        {"turn_digest": digest(run), "value-f1": "two"},
    )
    assert response.status_code == 422
    (line,) = [json.loads(x) for x in response.content.decode().splitlines()]
    assert line["event"] == "error" and line["code"] == "invalid_input"
    assert line["errors"] == [
        {"path": ["answer"], "message": "This field is required."},
        {"path": ["priority"], "message": "Enter a whole number."},
    ]
    assert "Correct “Your answer”" in line["html"] and 'value="two"' in line["html"]
    assert line["html"].count("This field is required.") == 1  # said once, beside its field
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_INPUT


def test_streamed_input_values_are_parsed_by_the_form_and_continue_inline(dev_client):
    run = waiting_for_input()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/input/stream/",
        {"turn_digest": digest(run), "value-f0": "blue", "value-f1": "2"},
    )
    received = list(lines(response))
    assert received[-1]["event"] == "end" and received[-1]["status"] == "completed"
    values = AgentRunEvent.objects.get(run=run, kind=EventKind.INPUT).payload["values"]
    assert values == {"answer": "blue", "priority": 2}


def test_the_lease_s_heartbeats_stream_as_they_happen_and_are_not_events(dev_client, settings):
    """A call longer than a third of the lease is renewed by the segment's heartbeat while it
    runs: each renewal is a ``heartbeat`` line between the call's proposal and its result."""
    settings.AGENTRUNS = {**settings.AGENTRUNS, "LEASE_SECONDS": 0.9}
    config(
        "slow",
        [
            {"tool_calls": [{"name": "wait", "arguments": {"seconds": 3.5}}]},
            {"content": "waited"},
        ],
    )
    received = list(lines(stream(dev_client, configuration="slow", prompt="wait")))
    kinds = [line.get("kind", line["event"]) for line in received]
    beats = [line for line in received if line["event"] == "heartbeat"]
    assert len(beats) >= 2, kinds
    first, last = kinds.index("heartbeat"), len(kinds) - 1 - kinds[::-1].index("heartbeat")
    assert kinds[first - 1] == "llm" and kinds[last + 1] == "tool"  # while the call ran
    assert "the lease was renewed" in beats[0]["html"] and "Heartbeat" in beats[0]["html"]
    run = AgentRun.objects.get()
    assert beats[0]["run"] == str(run.uuid)
    assert (
        not AgentRunEvent.objects.filter(run=run)
        .exclude(kind__in=[EventKind.LEASE, EventKind.REQUEST, EventKind.LLM, EventKind.TOOL])
        .exists()
    )
    assert received[-1]["event"] == "end" and received[-1]["status"] == "completed"
