"""Deciding several runs at once in the inbox: tick cards, approve or deny the selection. Each
run is decided on its own (its digest, its authority); the page then says what happened to each,
naming the run; a selection is approved only from cards shown in full."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import start_input_run, start_waiting_run
from tests.approvals.support.html import message_text, named_runs, sentences

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")
BATCH = reverse("approvals:decide-batch")
APPROVED = "Approved. A worker continues the run; its timeline shows what happens next."
SELF = "Not approved: A colleague must approve; you may deny."
CHECKBOX = re.compile(r'<input type="checkbox" form="inbox-batch" name="selected" value="([^"]+)"')


def selectable(client, path: str = INBOX) -> list[str]:
    """The values of the page's selection checkboxes, in page order (what a ticked box sends)."""
    response = client.get(path)
    assert response.status_code == 200
    return CHECKBOX.findall(response.content.decode())


def decide_selection(client, selected, decision="approve", *, shown="full", next_url=INBOX):
    data = {"decision": decision, "selected": selected, "shown": shown, "next": next_url}
    return client.post(BATCH, data, follow=True)


def test_twenty_runs_approved_at_once_with_one_refusal_among_them(client, decider, initiator):
    """Nineteen runs started by someone else and one the reviewer started under four-eyes: the
    nineteen are approved (each its own approval event, bound to its own card's digest), the
    one is refused and says why, and nothing of it changed."""
    four_eyes = AgentConfigurationFactory(name="Four eyes", require_second_approver=True)
    everything = [
        start_waiting_run(
            initiator=decider, arguments={"title": "Mine", "body": "b"}, configuration=four_eyes
        )
        if i == 7
        else start_waiting_run(initiator=initiator, arguments={"title": f"Note {i}", "body": "b"})
        for i in range(20)
    ]
    own = everything[7]
    waiting = [run for run in everything if run != own]
    client.force_login(decider)
    selected = selectable(client)
    assert selected == [f"{run.uuid}:{card_digest(run)}" for run in everything]

    response = decide_selection(client, selected)

    assert response.redirect_chain == [(INBOX, 302)]
    shown = sentences(response)
    assert shown[0] == "19 of 20 selected runs approved; 1 not (each says why below)."
    # One line per run, in the order selected, each naming its run.
    assert named_runs(response)[1:] == [str(run.uuid)[:8] for run in everything]
    assert shown[1:] == [SELF if run == own else APPROVED for run in everything]
    refused = message_text(list(response.context["messages"])[8])
    assert refused.startswith(f"Run {str(own.uuid)[:8]} (Four eyes): Not approved")
    # The page focuses what happened, and links every run it names.
    html = response.content.decode()
    assert 'id="outcome" tabindex="-1" autofocus' in html
    for run in everything:
        assert f'<a href="{reverse("approvals:run", args=[run.uuid])}">Run ' in html

    for run in waiting:
        run.refresh_from_db()
        assert run.status == Status.QUEUED
        event = AgentRunEvent.objects.get(run=run, kind="approval")
        assert event.payload["approved"] is True and event.actor == decider
        assert event.payload["turn_digest"] == card_digest_of(selected, run)
    own.refresh_from_db()
    assert own.status == Status.WAITING_FOR_APPROVAL
    assert not AgentRunEvent.objects.filter(run=own, kind="approval").exists()

    for run in waiting:
        assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert Note.objects.count() == 19 and not Note.objects.filter(title="Mine").exists()
    # The refused card is still there, and nothing else.
    assert selectable(client) == [f"{own.uuid}:{card_digest(own)}"]


def card_digest_of(selected: list[str], run: AgentRun) -> str:
    return next(v.split(":", 1)[1] for v in selected if v.startswith(str(run.uuid)))


def test_a_selection_is_denied_and_each_run_is_told(client, decider, initiator):
    first, second = start_waiting_run(initiator=initiator), start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = decide_selection(client, selectable(client), "deny")
    shown = sentences(response)
    assert shown[0] == "2 of 2 selected runs denied."
    assert all(line.startswith("Denied: none of the turn's calls runs") for line in shown[1:])
    for run in (first, second):
        run.refresh_from_db()
        assert run.status == Status.QUEUED
        assert AgentRunEvent.objects.get(run=run, kind="approval").payload["approved"] is False


def test_a_run_someone_decided_first_and_a_stale_card_are_each_said(
    client, decider, colleague, initiator
):
    taken, changed, fine = (start_waiting_run(initiator=initiator) for _ in range(3))
    client.force_login(decider)
    selected = selectable(client)
    runs.run_decide(
        run_uuid=taken.uuid, actor=colleague, approved=True, turn_digest=card_digest(taken)
    )
    stale = [
        v if not v.startswith(str(changed.uuid)) else f"{changed.uuid}:{'0' * 64}" for v in selected
    ]

    shown = sentences(decide_selection(client, stale))

    assert shown == [
        "1 of 3 selected runs approved; 2 not (each says why below).",
        "Someone already decided this — nothing was changed.",
        "Not approved: The pending action changed — review again.",
        APPROVED,
    ]
    assert AgentRunEvent.objects.filter(run=taken, kind="approval").get().actor == colleague
    changed.refresh_from_db()
    assert changed.status == Status.WAITING_FOR_APPROVAL
    fine.refresh_from_db()
    assert fine.status == Status.QUEUED


def test_only_approval_cards_are_selectable_and_only_in_the_inbox(client, decider, initiator):
    approval = start_waiting_run(initiator=initiator)
    start_input_run(initiator=initiator)
    client.force_login(decider)
    assert selectable(client) == [f"{approval.uuid}:{card_digest(approval)}"]
    assert selectable(client, reverse("approvals:run", args=[approval.uuid])) == []
    # Nothing to select: no batch form.
    assert 'id="inbox-batch"' not in client.get(INBOX + "?kind=input").content.decode()


def test_the_one_line_view_denies_a_selection_but_never_approves_one(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    compact = INBOX + "?view=compact"
    html = client.get(compact).content.decode()
    assert "Approve selected" not in html and "Deny selected" in html
    assert "switch to full cards" in html
    [value] = selectable(client, compact)

    refused = decide_selection(client, [value], shown="compact", next_url=compact)
    assert refused.redirect_chain == [(compact, 302)]
    assert sentences(refused)[0].startswith(
        "Nothing was decided: approving a selection needs the cards shown in full."
    )
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL

    assert sentences(decide_selection(client, [value], "deny", shown="compact"))[0] == (
        "1 of 1 selected run denied."
    )


def test_an_empty_or_malformed_selection_decides_nothing(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    assert sentences(decide_selection(client, [])) == [
        "Select at least one run, then approve or deny the selection."
    ]
    assert sentences(decide_selection(client, ["not-a-uuid:abc"])) == [
        "A selected card could not be read — nothing was changed. Select again."
    ]
    assert sentences(decide_selection(client, [str(run.uuid)])) == [
        "A selected card could not be read — nothing was changed. Select again."
    ]
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
