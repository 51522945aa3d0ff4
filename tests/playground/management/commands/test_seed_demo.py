"""``seed_demo`` (a playground command): demo configurations, notes and the two demo users."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from agentruns.event_summaries import summarise
from agentruns.models import AgentConfiguration, AgentRun, EventKind, Status
from agentruns.services import runs
from agentruns.turns import read_pending_turn
from playground.management.commands.seed_demo import EDITED_WELCOME_BODY
from playground.models import Note
from playground.receiver import DemoReceiver


@pytest.mark.django_db
def test_seed_demo_refuses_without_debug() -> None:
    with pytest.raises(CommandError):
        call_command("seed_demo", stdout=StringIO())
    assert not get_user_model().objects.exists()


@pytest.mark.django_db
def test_seed_demo_seeds_once_and_the_colleague_may_decide_and_play() -> None:
    for _ in range(2):  # idempotent
        call_command("seed_demo", "--force", stdout=StringIO())
    assert AgentConfiguration.objects.filter(slug="notes-assistant", is_active=True).exists()
    assert list(Note.objects.values_list("title", flat=True)) == ["Welcome", "Groceries"]
    users = get_user_model().objects
    assert users.get(username="admin").is_superuser
    colleague = users.get(username="colleague")
    assert colleague.is_staff and not colleague.is_superuser
    assert colleague.get_all_permissions() == {
        "agentruns.start_agentrun",
        "agentruns.decide_agentrun",
        "playground.use_playground",
    }
    # Only admin may approve webhooks: colleague can approve notes but not call_webhook.
    assert users.get(username="admin").has_perm("playground.approve_webhooks")
    assert not colleague.has_perm("playground.approve_webhooks")
    assert (
        AgentConfiguration.objects.get(slug="webhook-sender").script[0]["tool_calls"][0]["name"]
        == "call_webhook"
    )


# --- The demo tells the truth -----------------------------------------------------------------


@pytest.fixture
def demo(db, settings):
    """``seed_demo`` with the Webhook sender posting to a real receiver that is allowlisted."""
    receiver = DemoReceiver().start()
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [receiver.netloc]}
    url = receiver.url("/hooks/deployed")
    call_command("seed_demo", "--force", "--webhook-url", url, stdout=StringIO())
    yield receiver
    receiver.stop()


def _decided(slug: str, *, approved: bool) -> AgentRun:
    admin = get_user_model().objects.get(username="admin")
    run = runs.run_start_sync(
        configuration=AgentConfiguration.objects.get(slug=slug), prompt="go", initiator=admin
    ).run
    assert run.status == Status.WAITING_FOR_APPROVAL
    runs.run_decide(
        run_uuid=run.uuid,
        actor=admin,
        approved=approved,
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    return run


def test_the_webhook_sender_answers_what_happened(demo, settings) -> None:
    denied = _decided("webhook-sender", approved=False)
    assert denied.output == "You denied the webhook, so I did not send it."
    assert demo.deliveries.all() == []

    sent = _decided("webhook-sender", approved=True)
    assert sent.output.startswith("I sent the deployment webhook")
    [delivery] = demo.deliveries.all()
    assert delivery.idempotency_key == f"{sent.uuid}:call_0_0"

    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": []}
    refused = _decided("webhook-sender", approved=True)
    assert refused.output.startswith("The webhook was refused before anything was sent")
    tool = refused.events.get(kind=EventKind.TOOL)
    assert (tool.payload["outcome"], tool.payload["ok"]) == ("refused", False)
    assert summarise(tool.kind, tool.payload).endswith(": refused — not sent")

    demo.stop()  # nobody listens any more: the call fails, nothing was sent
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [demo.netloc]}
    failed = _decided("webhook-sender", approved=True)
    assert failed.output == "The webhook could not be delivered (its error is in the trace)."


def test_the_notes_assistant_answers_a_denial_and_an_approval(demo) -> None:
    denied = _decided("notes-assistant", approved=False)
    assert "you denied creating the stand-up note, so I created nothing" in denied.output
    assert not Note.objects.filter(title="Stand-up").exists()
    approved = _decided("notes-assistant", approved=True)
    assert approved.output == "I listed the notes and created the stand-up note."


def test_the_note_editor_shows_a_real_before_and_after(demo) -> None:
    admin = get_user_model().objects.get(username="admin")
    run = runs.run_start_sync(
        configuration=AgentConfiguration.objects.get(slug="note-editor"),
        prompt="tidy",
        initiator=admin,
    ).run
    [call] = read_pending_turn(run).calls
    [change] = call.preview.changes
    assert (change.field, change.before) == ("body", "Leasehold keeps writes honest.")
    assert change.after == EDITED_WELCOME_BODY


def test_the_notes_assistant_is_offered_first(demo, client) -> None:
    client.force_login(get_user_model().objects.get(username="admin"))
    form = client.get("/playground/").context["form"]
    choices = [str(label) for _, label in form.fields["configuration"].choices]
    assert choices[0] == "Notes assistant (scripted)"
    chosen = client.get("/playground/?configuration=note-editor").context["form"]
    assert chosen["configuration"].value() == "note-editor"
