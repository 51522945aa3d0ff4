"""The playground's decision block decides per call as the inbox does, batch and streamed: a
denial with a reason beside an approval; an edit the tool's schema refuses comes back on the
card (422 / one error line carrying the card), each problem said once, never as a raw code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.support.api import config, digest
from tests.playground.conftest import join_streams

REASON = "Not <now>, please"


@pytest.fixture(autouse=True)
def _segments_stop():
    yield
    join_streams()


def two_writes(developer) -> AgentRun:
    script = [
        {
            "tool_calls": [
                {"name": "create_note", "arguments": {"title": "One", "body": "b"}},
                {"name": "create_note", "arguments": {"title": "Two", "body": "b"}},
            ]
        },
        {"content": "Done."},
    ]
    result = runs.run_start_sync(
        configuration=config("two-notes", script), prompt="two", initiator=developer
    )
    assert result.run.status == Status.WAITING_FOR_APPROVAL
    return AgentRun.objects.get(pk=result.run.pk)


def verdicts(run: AgentRun, **fields: Any) -> dict[str, Any]:
    data = {"decision": "calls", "turn_digest": digest(run)}
    # c1_verdict → verdict-c1-verdict; c1_e_f0 (the edit's first field) → verdict-c1-e-f0
    data.update(
        {"verdict-" + k.replace("_e_", "-e-").replace("_", "-", 1): v for k, v in fields.items()}
    )
    return data


def lines(response) -> Iterator[dict]:
    for chunk in response.streaming_content:
        for line in chunk.decode().splitlines():
            yield json.loads(line)


@pytest.mark.django_db
def test_batch_approve_one_deny_the_other_with_a_reason(dev_client, developer):
    run = two_writes(developer)
    page = dev_client.get(f"/playground/runs/{run.uuid}/").content.decode()
    assert 'name="verdict-c1-verdict" value="approve"' in page
    assert "Send the verdicts chosen above" in page and "Approve all" in page

    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/",
        verdicts(run, c1_verdict="approve", c2_verdict="deny", c2_reason=REASON),
    )
    assert response.status_code == 302
    # Back on the run, where it stands now takes the focus.
    assert response["Location"] == f"/playground/runs/{run.uuid}/?decided=1#outcome"
    assert (
        '<div id="outcome" tabindex="-1" autofocus>'
        in dev_client.get(response["Location"]).content.decode()
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert list(Note.objects.values_list("title", flat=True)) == ["One"]
    trace = dev_client.get(f"/playground/runs/{run.uuid}/").content.decode()
    assert "Decided per call</strong> by dev" in trace
    assert "Not &lt;now&gt;, please" in trace and REASON not in trace


@pytest.mark.django_db
def test_batch_verdicts_the_forms_refuse_come_back_with_422(dev_client, developer):
    run = two_writes(developer)
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/", verdicts(run, c1_verdict="approve")
    )
    assert response.status_code == 422
    html = response.content.decode()
    assert html.count("Choose what happens to this call.") == 1
    assert "autofocus" in html and "Nothing was decided" in html
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


@pytest.mark.django_db(transaction=True)
def test_streamed_an_edit_the_schema_refuses_is_one_error_line_carrying_the_card(
    dev_client, developer
):
    run = two_writes(developer)
    too_long = "x" * 201  # the title's maxLength is 200: the form refuses it first
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/",
        verdicts(run, c1_verdict="edit", c1_e_f0=too_long, c1_e_f1="b", c2_verdict="deny"),
    )
    assert response.status_code == 422
    (line,) = [json.loads(x) for x in response.content.decode().splitlines()]
    assert line["event"] == "error" and line["code"] == "verdicts_refused"
    assert line["message"].startswith("Nothing was decided")
    assert line["html"].count("Ensure this value has at most 200 characters") == 1
    assert "invalid_arguments" not in line["html"]
    assert not AgentRunEvent.objects.filter(run=run, kind="approval").exists()


@pytest.mark.django_db(transaction=True)
def test_streamed_per_call_decision_continues_inline(dev_client, developer):
    run = two_writes(developer)
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/stream/",
        verdicts(run, c1_verdict="deny", c1_reason=REASON, c2_verdict="approve"),
    )
    received = list(lines(response))
    assert received[0]["kind"] == "approval"
    assert "Decided per call" in received[0]["html"]
    assert "Not &lt;now&gt;, please" in received[0]["html"]
    assert received[-1]["event"] == "end" and received[-1]["status"] == "completed"
    assert list(Note.objects.values_list("title", flat=True)) == ["Two"]
