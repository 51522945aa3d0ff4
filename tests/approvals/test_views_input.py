"""Supplying input: a form generated from the pending turn's schema; invalid values re-render
with 422, an error summary that takes focus and the values kept; refusals are messages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.input_forms import input_spec
from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import runs
from agentruns.turns import turn_digest
from tests.agentruns.factories import AgentRunFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import start_input_run, start_waiting_run
from tests.approvals.support.html import (
    heading_levels,
    headings_in_order,
    sentences,
    unlabelled_fields,
)

pytestmark = pytest.mark.django_db

STALE = "The pending action changed — review again."


def submit(client, run, values, digest=None, follow=True):
    data = {f"run{run.pk}-{name}": value for name, value in values.items()}
    data["turn_digest"] = digest or card_digest(run)
    data["next"] = reverse("approvals:inbox")
    return client.post(reverse("approvals:input", args=[run.uuid]), data, follow=follow)


def shown_messages(response) -> list[str]:
    return sentences(response)


def assert_nothing_decided(run):
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    assert not AgentRunEvent.objects.filter(run=run, kind="input").exists()


def test_valid_input_is_sent_and_the_worker_continues(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": "Ship it", "f1": "2"})
    assert response.redirect_chain == [(reverse("approvals:inbox"), 302)]
    assert shown_messages(response) == [
        "Input sent. A worker continues the run; its timeline shows what happens next."
    ]
    event = AgentRunEvent.objects.get(run=run, kind="input")
    assert event.payload["values"] == {"answer": "Ship it", "priority": 2}
    assert event.actor == decider
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    tool = AgentRunEvent.objects.get(run=run, kind="tool")
    assert tool.payload["result"]["answer"] == "Ship it"


def test_an_empty_optional_field_is_left_out(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    submit(client, run, {"f0": "Yes", "f1": ""})
    assert AgentRunEvent.objects.get(run=run, kind="input").payload["values"] == {"answer": "Yes"}


def test_invalid_input_re_renders_with_422_a_focused_summary_and_the_values_kept(
    client, decider, initiator
):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": "", "f1": "-3"}, follow=False)
    assert response.status_code == 422
    html = response.content.decode()
    summary = html[html.index('class="approvals-error-summary"') :]
    summary = summary[: summary.index("</div>")]
    assert 'tabindex="-1"' in summary and "autofocus" in summary
    assert "nothing was sent" in summary
    # The summary links each field; what is wrong is said once, beside the field it describes.
    assert f'href="#id_run{run.pk}-f0">Correct “Your answer”</a>' in summary
    assert f'href="#id_run{run.pk}-f1">Correct “Priority (0 or more)”</a>' in summary
    for error in ("This field is required.", "Ensure this value is greater than or equal to 0."):
        assert html.count(error) == 1, error
    assert f'id="id_run{run.pk}-f1_error"><strong>Error:</strong> Ensure' in html
    assert f'aria-describedby="id_run{run.pk}-f1_helptext id_run{run.pk}-f1_error"' in html
    assert f'name="run{run.pk}-f1" value="-3"' in html  # the value is kept
    assert 'aria-invalid="true"' in html
    assert "invalid_input" not in html
    # The reviewer stays on the inbox they sent it from.
    assert "approvals/inbox.html" in [t.name for t in response.templates]
    assert headings_in_order(heading_levels(html))
    assert unlabelled_fields(html) == []
    assert_nothing_decided(run)


def test_a_value_of_the_wrong_type_is_422_and_kept(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": "Kept answer", "f1": "high"}, follow=False)
    assert response.status_code == 422
    html = response.content.decode()
    assert "<strong>Error:</strong> Enter a whole number." in html
    assert "Kept answer</textarea>" in html
    assert_nothing_decided(run)


def crafted_input_run(schema) -> AgentRun:
    call = {"id": "call_0_0", "name": "ask_human", "arguments": {"question": "q"}}
    return AgentRunFactory(
        status=Status.WAITING_FOR_INPUT,
        lease_epoch=1,
        pending_turn={
            "kind": "input",
            "call": {**call, "effect": "read"},
            "input_schema": schema,
            "turn_digest": turn_digest([call], input_schema=schema),
        },
        loop_state={
            "iteration": 1,
            "turn": {"calls": [{**call, "effect": "read"}], "done": [], "approved": None},
        },
    )


def test_schema_errors_beyond_the_fields_checks_are_422_too(client, decider):
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$", "title": "Code"}},
        "required": ["code"],
    }
    run = crafted_input_run(schema)
    client.force_login(decider)
    response = submit(client, run, {"f0": "abc"}, follow=False)
    assert response.status_code == 422
    html = response.content.decode()
    assert "<strong>Error:</strong> &#x27;abc&#x27; does not match &#x27;^[A-Z]{3}$&#x27;" in html
    assert 'aria-invalid="true"' in html
    assert "\nabc</textarea>" in html
    assert_nothing_decided(run)


def test_checkbox_number_and_choice_fields(client, decider):
    schema = {
        "type": "object",
        "properties": {
            "urgent": {"type": "boolean", "title": "Urgent"},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1, "title": "Ratio"},
            "team": {"type": "string", "enum": ["red", "blue"], "title": "Team"},
        },
        "required": ["ratio", "team"],
    }
    run = crafted_input_run(schema)
    run.refresh_from_db()  # PostgreSQL's jsonb may store the properties in another order
    names = {key: name for name, key in input_spec(run.pending_turn["input_schema"]).keys.items()}
    client.force_login(decider)
    html = client.get(reverse("approvals:inbox")).content.decode()
    assert f'type="checkbox" name="run{run.pk}-{names["urgent"]}"' in html
    assert f'type="number" name="run{run.pk}-{names["ratio"]}"' in html and 'step="any"' in html
    assert f'<select name="run{run.pk}-{names["team"]}"' in html
    assert unlabelled_fields(html) == []
    submit(client, run, {names["urgent"]: "on", names["ratio"]: "0.25", names["team"]: "blue"})
    values = AgentRunEvent.objects.get(run=run, kind="input").payload["values"]
    assert values == {"urgent": True, "ratio": 0.25, "team": "blue"}


def test_a_stale_digest_is_refused_with_a_message(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": "Fine"}, digest="0" * 64)
    assert shown_messages(response) == [STALE]
    assert_nothing_decided(run)


def test_invalid_values_for_a_changed_turn_show_the_current_turn(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": ""}, digest="0" * 64, follow=False)
    assert response.status_code == 422
    html = response.content.decode()
    assert STALE in html
    assert f'name="turn_digest" value="{card_digest(run)}"' in html
    assert 'value="0000' not in html


def test_input_for_a_run_that_no_longer_waits_for_input(client, decider, colleague, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    submit(client, run, {"f0": "First"})
    client.force_login(colleague)
    response = submit(client, run, {"f0": "Second"})
    assert shown_messages(response) == [
        "This run is not waiting for that decision anymore (it is now queued) — nothing was "
        "changed."
    ]
    assert AgentRunEvent.objects.filter(run=run, kind="input").count() == 1


def test_input_for_an_approval_run_is_not_waiting(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = submit(client, run, {"f0": "x"})
    assert "it is now waiting for approval" in shown_messages(response)[0]


def test_input_for_an_unreadable_turn_is_refused(client, decider):
    run = AgentRunFactory(status=Status.WAITING_FOR_INPUT, pending_turn={"kind": "input"})
    client.force_login(decider)
    response = submit(client, run, {"f0": "x"}, digest="x")
    assert shown_messages(response) == [
        "This run's stored state cannot be read — nothing was changed."
    ]


def test_input_when_no_form_can_be_offered_is_refused(client, decider):
    schema = {"type": "object", "properties": {}, "required": []}
    run = crafted_input_run(schema)
    client.force_login(decider)
    response = submit(client, run, {})
    assert "The form was incomplete" in shown_messages(response)[0]
    assert_nothing_decided(run)
