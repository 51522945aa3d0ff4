"""The playground pages without streaming: access, the batch run and its trace, deciding."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.transcript import request_messages
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import (
    APPROVAL_SCRIPT,
    INPUT_SCRIPT,
    config,
    digest,
    waiting_for_approval,
)
from tests.playground.conftest import USE

pytestmark = pytest.mark.django_db

TOOL_SCRIPT = [
    {"tool_calls": [{"name": "list_notes", "arguments": {}}], "usage": {"prompt_tokens": 11}},
    {"content": "There are no notes.", "usage": {"prompt_tokens": 17, "completion_tokens": 5}},
]


def start(client: Client, **data) -> object:
    return client.post("/playground/run/", {"mode": "batch", **data})


# --- Access ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user_kwargs",
    [
        None,  # anonymous
        {"username": "staff-without-permission"},
        {"username": "outsider", "is_staff": False, "permissions": [USE]},
    ],
)
def test_others_are_sent_to_the_admin_login(client, user_kwargs):
    if user_kwargs is not None:
        client.force_login(UserFactory(**user_kwargs))
    for response in [client.get("/playground/"), start(client, prompt="x")]:
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


def test_superusers_may_use_it_implicitly(client):
    client.force_login(UserFactory(username="root", is_superuser=True))
    assert client.get("/playground/").status_code == 200


def test_starting_a_run_needs_the_start_permission_as_in_the_api(client):
    """The playground opens with ``use_playground``; its Run buttons need
    ``agentruns.start_agentrun`` too (the API's rule). Refused: nothing starts, batch or
    streamed, and the page says why instead of offering the buttons."""
    config("hello", [{"content": "hi"}])
    client.force_login(UserFactory(username="looker", permissions=[USE]))
    html = client.get("/playground/").content.decode()
    assert 'id="run-batch"' not in html and 'id="run-streamed"' not in html
    assert "starting a run needs agentruns.start_agentrun" in html
    refused = start(client, configuration="hello", prompt="p")
    assert refused.status_code == 403
    assert "starting a run needs agentruns.start_agentrun" in refused.content.decode()
    streamed = client.post("/playground/stream/", {"configuration": "hello", "prompt": "p"})
    assert streamed.status_code == 403
    assert json.loads(streamed.content) == {
        "event": "error",
        "code": "not_permitted",
        "message": "starting a run needs agentruns.start_agentrun",
    }
    assert not AgentRun.objects.exists()


def test_developers_see_the_form(dev_client):
    config("hello", [{"content": "hi"}])
    html = dev_client.get("/playground/").content.decode()
    assert 'name="configuration"' in html and "hello" in html
    assert 'name="tools"' in html and "create_note" in html
    assert 'name="system_prompt"' in html and 'name="max_iterations"' in html
    assert "csrfmiddlewaretoken" in html
    assert 'id="run-batch"' in html and 'id="run-streamed"' in html


def test_forms_need_the_csrf_token(developer):
    client = Client(enforce_csrf_checks=True)
    client.force_login(developer)
    config("hello", [{"content": "hi"}])
    assert start(client, configuration="hello", prompt="p").status_code == 403
    assert client.post("/playground/stream/", {"configuration": "hello"}).status_code == 403
    assert not AgentRun.objects.exists()


# --- The batch run and its trace ---------------------------------------------------------------


def test_a_batch_run_renders_the_finished_trace(dev_client, developer):
    config("notes-reader", TOOL_SCRIPT, system_prompt="You keep notes.")
    response = start(dev_client, configuration="notes-reader", prompt="How many notes?")
    run = AgentRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/playground/runs/{run.uuid}/"
    assert run.initiator == developer and run.status == Status.COMPLETED

    html = dev_client.get(response["Location"]).content.decode()
    assert "Round 1" in html and "Round 2" in html
    assert "You keep notes." in html and "How many notes?" in html  # messages sent
    assert "There are no notes." in html  # the model's answer
    assert "11 prompt" in html and "17 prompt + 5 completion tokens" in html
    assert "list_notes" in html and "effect-read" in html
    tool = run.events.get(kind=EventKind.TOOL)
    assert f"{tool.duration_ms} ms" in html
    assert "&quot;notes&quot;: []" in html  # the tool's result


def test_options_narrow_tools_override_the_prompt_and_cap_rounds(dev_client):
    config("loop", [{"tool_calls": [{"name": "list_notes"}]}] * 3 + [{"content": "capped"}])
    start(
        dev_client,
        configuration="loop",
        prompt="p",
        tools=["list_notes", "read_note"],
        system_prompt="Be brief.",
        max_iterations="1",
    )
    run = AgentRun.objects.get()
    assert run.request["tools"] == ["list_notes", "read_note"]
    requests = list(run.events.filter(kind=EventKind.REQUEST).order_by("sequence"))
    assert requests[0].payload["tools"] == ["list_notes", "read_note"]
    assert requests[0].payload["system"] == "Be brief."
    sent = request_messages(requests[0].run)
    assert sent[requests[0].sequence][0] == {"role": "system", "content": "Be brief."}
    assert run.termination_reason == "max_iterations" and run.truncated


@pytest.mark.parametrize(
    "data",
    [
        {"configuration": "hello", "prompt": ""},
        {"configuration": "nope", "prompt": "p"},
        {"configuration": "hello", "prompt": "p", "max_iterations": "21"},
        {"configuration": "hello", "prompt": "p", "tools": ["no_such_tool"]},
    ],
)
def test_invalid_forms_are_shown_again_with_errors(dev_client, data):
    config("hello", [{"content": "hi"}])
    response = start(dev_client, **data)
    assert response.status_code == 400
    assert "errorlist" in response.content.decode()
    assert not AgentRun.objects.exists()


def test_a_tool_the_configuration_does_not_allow_is_refused_by_the_service(dev_client):
    config("limited", [{"content": "hi"}], tools=["list_notes"])
    response = start(dev_client, configuration="limited", prompt="p", tools=["create_note"])
    assert response.status_code == 400
    assert "not available to this configuration" in response.content.decode()


def test_model_chosen_text_is_escaped(dev_client):
    evil = "<script>alert(1)</script>"
    config(
        "evil",
        [
            {"tool_calls": [{"name": "create_note", "arguments": {"title": evil, "body": evil}}]},
        ],
    )
    response = start(dev_client, configuration="evil", prompt=evil)
    html = dev_client.get(response["Location"]).content.decode()
    assert evil not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_history_lists_only_my_runs_with_links_to_the_timeline(dev_client, developer):
    config("hello", [{"content": "hi"}])
    mine = runs.run_start_sync(configuration="hello", prompt="mine", initiator=developer).run
    theirs = runs.run_start_sync(configuration="hello", prompt="theirs").run
    html = dev_client.get("/playground/").content.decode()
    assert f"/playground/runs/{mine.uuid}/" in html
    assert f"/admin/approvals/runs/{mine.uuid}/" in html or (
        f"/admin/agentruns/agentrun/{mine.pk}/change/" in html
    )
    assert str(theirs.uuid) not in html


def test_an_unknown_run_page_is_404(dev_client):
    assert (
        dev_client.get("/playground/runs/00000000-0000-0000-0000-000000000000/").status_code == 404
    )


# --- Deciding right there ---------------------------------------------------------------------


def test_a_suspended_run_shows_its_pending_turn_with_approve_and_deny(dev_client):
    start(dev_client, configuration=config("notes", APPROVAL_SCRIPT).slug, prompt="note it")
    run = AgentRun.objects.get()
    assert run.status == Status.WAITING_FOR_APPROVAL
    html = dev_client.get(f"/playground/runs/{run.uuid}/").content.decode()
    assert "Waiting for approval" in html
    assert f'value="{digest(run)}"' in html
    assert 'name="decision" value="approve"' in html and 'name="decision" value="deny"' in html
    assert f"/playground/runs/{run.uuid}/decision/stream/" in html
    assert "effect-non_idempotent_write" in html


def test_approving_continues_inline_and_shows_the_result(dev_client, developer):
    run = waiting_for_approval(user=developer)
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/", {"approved": "1", "turn_digest": digest(run)}
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Status.COMPLETED and Note.objects.count() == 1
    html = dev_client.get(response["Location"]).content.decode()
    assert "Approved" in html and "created" in html


def test_denying_runs_nothing(dev_client):
    run = waiting_for_approval()
    dev_client.post(
        f"/playground/runs/{run.uuid}/decision/", {"approved": "0", "turn_digest": digest(run)}
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED and not Note.objects.exists()


def test_a_stale_decision_is_refused_with_a_message(dev_client):
    run = waiting_for_approval()
    response = dev_client.post(
        f"/playground/runs/{run.uuid}/decision/",
        {"approved": "1", "turn_digest": "0" * 64},
        follow=True,
    )
    assert "review again" in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_deciding_needs_the_decide_permission(client):
    tinkerer = UserFactory(username="tinkerer", permissions=[USE])
    client.force_login(tinkerer)
    run = waiting_for_approval(tinkerer)  # their own: another's run does not exist for them
    response = client.post(
        f"/playground/runs/{run.uuid}/decision/",
        {"approved": "1", "turn_digest": digest(run)},
        follow=True,
    )
    assert "decide_agentrun" in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_the_input_form_is_rendered_and_its_values_typed(dev_client):
    start(dev_client, configuration=config("asker", INPUT_SCRIPT).slug, prompt="ask")
    run = AgentRun.objects.get()
    html = dev_client.get(f"/playground/runs/{run.uuid}/").content.decode()
    # ask_human declares answer, then priority: the shared input form names them value-f0, -f1.
    assert '<label for="id_value-f0">Your answer (required)</label>' in html
    assert '<label for="id_value-f1">Priority (0 or more) (optional)</label>' in html
    # The question leads, above the form; the schema's descriptions are the fields' hints.
    assert html.index('<p class="text">Which colour?</p>') < html.index('<label for="id_value-f0">')
    assert "What the agent is told in reply to its question." in html
    assert 'aria-describedby="id_value-f0_helptext"' in html
    # Links named for screen readers with the short run id; cancel offered to its initiator.
    assert f'<span class="visually-hidden"> of run {str(run.uuid)[:8]}</span>' in html
    assert f'href="/playground/runs/{run.uuid}/cancel/"' in html
    assert 'type="number" name="value-f1"' in html

    refused = dev_client.post(
        f"/playground/runs/{run.uuid}/input/",
        {"turn_digest": digest(run), "value-f1": "2"},
    )
    assert refused.status_code == 422
    text = refused.content.decode()
    assert "do not match the input schema" in text and "Correct “Your answer”" in text
    assert text.count("This field is required.") == 1  # said once, beside its field
    assert 'value="2"' in text  # the value typed is kept
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_INPUT

    dev_client.post(
        f"/playground/runs/{run.uuid}/input/",
        {"turn_digest": digest(run), "value-f0": "blue", "value-f1": "2"},
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert run.events.get(kind=EventKind.INPUT).payload["values"] == {
        "answer": "blue",
        "priority": 2,
    }


def test_cancel_needs_a_confirmation_csrf_and_the_cancel_rules(dev_client, developer):
    other = UserFactory(username="other-dev", permissions=[USE])
    mine = waiting_for_approval(developer)
    theirs = AgentRun.objects.get(pk=waiting_for_approval(other, slug="theirs").pk)
    confirm = dev_client.get(f"/playground/runs/{mine.uuid}/cancel/").content.decode()
    assert "Cancel run" in confirm and 'name="csrfmiddlewaretoken"' in confirm
    assert AgentRun.objects.get(pk=mine.pk).status == Status.WAITING_FOR_APPROVAL
    # Another's run: visible to a decider, but cancelling it needs agentruns.cancel_agentrun.
    page = dev_client.get(f"/playground/runs/{theirs.uuid}/").content.decode()
    assert f"/playground/runs/{theirs.uuid}/cancel/" not in page
    refused = dev_client.post(f"/playground/runs/{theirs.uuid}/cancel/", follow=True)
    assert "Not cancelled: cancelling a run someone else started needs" in refused.content.decode()
    assert AgentRun.objects.get(pk=theirs.pk).status == Status.WAITING_FOR_APPROVAL
    # Without the CSRF token nothing happens.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(developer)
    assert strict.post(f"/playground/runs/{mine.uuid}/cancel/").status_code == 403
    dev_client.post(f"/playground/runs/{mine.uuid}/cancel/")
    assert AgentRun.objects.get(pk=mine.pk).status == Status.CANCELLED
    again = dev_client.post(f"/playground/runs/{mine.uuid}/cancel/", follow=True)
    assert "Nothing was cancelled: the run had already ended (cancelled)." in (
        again.content.decode()
    )
