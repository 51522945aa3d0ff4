"""A verdict per call on the inbox card, without JavaScript: approve one call and deny the other
with a reason, answer a call, edit its arguments (a form of the tool's schema, or raw JSON) and
approve the new card; what the forms or the tool's schema refuse comes back in place (422) with
each problem said once; every chosen text arrives escaped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.support.html import sentences

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")


@pytest.fixture
def recorded():
    with ScriptedProvider.recording():
        yield ScriptedProvider


@pytest.fixture
def root(db):
    """Holds every permission (``call_webhook`` needs ``playground.approve_webhooks``)."""
    return UserFactory(username="root", is_superuser=True)


def two_calls(initiator=None, *, title: str = "Stand-pu", **fields: Any) -> AgentRun:
    """A real run waiting on one turn of two writes: a note and a webhook."""
    result = runs.run_start_sync(
        configuration=AgentConfigurationFactory(name="Notes assistant", **fields),
        prompt="Note the stand-up and tell the team",
        initiator=initiator,
        options={
            "script": [
                {
                    "tool_calls": [
                        {"name": "create_note", "arguments": {"title": title, "body": "9:30"}},
                        {
                            "name": "call_webhook",
                            "arguments": {"url": "http://hooks.invalid/x", "payload": {"a": 1}},
                        },
                    ]
                },
                {"content": "Done."},
            ]
        },
    )
    assert result.run.status == Status.WAITING_FOR_APPROVAL
    return AgentRun.objects.get(pk=result.run.pk)


def post(client, run, decision="calls", *, follow=True, **fields: Any):
    """The card's form as a browser posts it: ``c1_verdict="deny"`` → ``run<pk>-c1-verdict``."""
    data: dict[str, Any] = {
        "decision": decision,
        "turn_digest": card_digest(run),
        "next": INBOX,
    }
    for name, value in fields.items():
        call, _, field = name.partition("_")
        data[
            f"run{run.pk}-{call}-{field.replace('_', '-') if field.startswith('e_') else field}"
        ] = value
    return client.post(reverse("approvals:decide", args=[run.uuid]), data, follow=follow)


def approval_payload(run: AgentRun) -> dict[str, Any]:
    return AgentRunEvent.objects.filter(run=run, kind="approval").latest("sequence").payload


def test_approve_one_call_and_deny_the_other_with_a_reason_the_model_reads(client, root, recorded):
    run = two_calls()
    client.force_login(root)
    reason = "Use the staging hook <b>instead</b>"
    response = post(client, run, c1_verdict="approve", c2_verdict="deny", c2_reason=reason)

    assert response.redirect_chain == [(INBOX, 302)]
    assert sentences(response) == [
        "Decided per call: 1 approved, 1 denied. The model reads your reasons, marked as your "
        "words. A worker continues the run; its timeline shows what happens next."
    ]
    payload = approval_payload(run)
    assert [(c["name"], c["verdict"], c.get("reason")) for c in payload["calls"]] == [
        ("create_note", "approve", None),
        ("call_webhook", "deny", reason),
    ]
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert Note.objects.filter(title="Stand-pu").count() == 1
    told = {
        m["tool_call_id"]: m["content"]
        for m in recorded.recorded(str(run.uuid))[-1]
        if m["role"] == "tool"
    }
    assert json.loads(told[payload["calls"][1]["id"]])["reason_given_by_the_reviewer"] == reason

    # The timeline says it, escaped.
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "Use the staging hook &lt;b&gt;instead&lt;/b&gt;" in timeline
    assert "<b>instead</b>" not in timeline
    assert "Denied by root, did not run." in timeline


def test_answer_a_call_instead_of_running_it(client, root, recorded):
    run = two_calls()
    client.force_login(root)
    response = post(
        client,
        run,
        c1_verdict="answer",
        c1_answer='{"id": 7, "title": "Stand-up"}',
        c1_answer_is_json="on",
        c2_verdict="deny",
    )
    assert sentences(response)[0].startswith("Decided per call: 1 denied, 1 answered.")
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert not Note.objects.exists()  # answered: the tool did not run
    [answered] = [
        e.payload
        for e in AgentRunEvent.objects.filter(run=run, kind="tool")
        if e.payload["outcome"] == "answered"
    ]
    assert answered["result"] == {"id": 7, "title": "Stand-up"}
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "Answered by root, not run." in timeline


def test_edit_a_call_on_the_card_and_approve_the_new_card(client, root, recorded):
    run = two_calls()
    editor = UserFactory(username="editor", permissions=["agentruns.decide_agentrun"])
    client.force_login(editor)
    html = client.get(INBOX).content.decode()
    assert f'name="run{run.pk}-c1-e-f0" value="Stand-pu"' in html  # the model's value, filled in
    # The webhook's payload is an object: its edit is raw JSON (and this reader may not edit it).
    response = post(
        client, run, c1_verdict="edit", c1_e_f0="Stand-up", c1_e_f1="9:30", c2_verdict="deny"
    )
    assert sentences(response)[0].startswith("Decided per call: 1 denied, 1 edited.")
    assert "Nothing runs yet" in sentences(response)[0]
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "awaiting_approval"
    run.refresh_from_db()
    assert not Note.objects.exists()

    # The new card shows the edit beside the original, and is approved as usual.
    client.force_login(root)
    card = client.get(INBOX).content.decode()
    assert "Arguments as edited by editor" in card and "As the model proposed them" in card
    assert "&quot;title&quot;: &quot;Stand-up&quot;" in card
    assert "&quot;title&quot;: &quot;Stand-pu&quot;" in card
    assert sentences(post(client, run, "approve"))[0].startswith("Approved.")
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert list(Note.objects.values_list("title", flat=True)) == ["Stand-up"]
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "Run with the arguments as edited by editor" in timeline


def test_raw_json_edit_the_schema_refuses_comes_back_in_place(client, root):
    run = two_calls()
    client.force_login(root)
    bad = json.dumps({"url": "http://hooks.invalid/x", "payload": "not an object"})
    response = post(
        client, run, follow=False, c1_verdict="approve", c2_verdict="edit", c2_arguments_json=bad
    )
    assert response.status_code == 422
    html = response.content.decode()
    assert "approvals/inbox.html" in [t.name for t in response.templates]
    assert "There is a problem with your verdicts on run" in html
    assert 'autofocus role="alert"' in html
    assert html.count("is not of type") == 1  # said once, on the call it concerns
    assert "not an object" in html  # the value typed is kept
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    assert not AgentRunEvent.objects.filter(run=run, kind="approval").exists()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"c1_verdict": "approve"}, "Choose what happens to this call."),
        (
            {"c1_verdict": "approve", "c1_reason": "why", "c2_verdict": "deny"},
            "A reason goes with a denial: choose Deny, or clear the reason.",
        ),
        (
            {
                "c1_verdict": "answer",
                "c1_answer": "{oops",
                "c1_answer_is_json": "on",
                "c2_verdict": "deny",
            },
            "This is not JSON (",
        ),
        (
            {"c1_verdict": "answer", "c2_verdict": "deny"},
            "Give the result the model should receive.",
        ),
    ],
)
def test_verdicts_the_forms_refuse_change_nothing(client, root, fields, problem):
    run = two_calls()
    client.force_login(root)
    response = post(client, run, follow=False, **fields)
    assert response.status_code == 422
    html = response.content.decode()
    assert html.count(problem) == 1
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_deny_all_with_a_reason_typed_on_a_call_denies_every_call(client, root, recorded):
    run = two_calls()
    client.force_login(root)
    response = post(client, run, "deny", c2_reason="Not today")
    assert sentences(response)[0].startswith("Decided per call: 2 denied.")
    assert [(c["verdict"], c.get("reason", "")) for c in approval_payload(run)["calls"]] == [
        ("deny", ""),
        ("deny", "Not today"),
    ]
    # Without a reason, Deny all is the whole-turn denial.
    other = two_calls()
    assert sentences(post(client, other, "deny"))[0].startswith("Denied: none of the turn's")
    assert approval_payload(other)["approved"] is False


def test_a_reader_who_may_only_deny_the_webhook_gets_deny_only_on_that_call(client, decider):
    run = two_calls()
    client.force_login(decider)
    html = client.get(INBOX).content.decode()
    for verdict in ("approve", "deny", "answer", "edit"):
        assert f'name="run{run.pk}-c1-verdict" value="{verdict}"' in html
    assert f'name="run{run.pk}-c2-verdict" value="deny"' in html
    for verdict in ("approve", "answer", "edit"):
        assert f'name="run{run.pk}-c2-verdict" value="{verdict}"' not in html
    assert "You may not approve, answer or edit this call:" in html
    assert ">Approve all</button>" not in html and ">Deny all</button>" in html

    response = post(client, run, c1_verdict="approve", c2_verdict="deny")
    assert sentences(response)[0].startswith("Decided per call: 1 approved, 1 denied.")


def test_four_eyes_the_initiator_may_not_approve_a_call_but_may_answer_it(client, initiator):
    run = two_calls(initiator=initiator, require_second_approver=True)
    client.force_login(initiator)
    html = client.get(INBOX).content.decode()
    assert f'name="run{run.pk}-c1-verdict" value="approve"' not in html
    assert f'name="run{run.pk}-c1-verdict" value="answer"' in html
    assert "A colleague must approve this call" in html


def test_model_chosen_arguments_arrive_escaped_in_the_edit_form(client, root):
    run = two_calls(title='"><script>alert(1)</script>')
    client.force_login(root)
    html = client.get(INBOX).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert (
        f'name="run{run.pk}-c1-e-f0" value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"'
        in html
    )
