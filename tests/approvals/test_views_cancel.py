"""*Cancel run* in the inbox, the timeline and the admin (issue 17 §1): a confirmation step that
needs no JavaScript, the cancel service's rules (the initiator, or ``agentruns.cancel_agentrun``;
a run in doubt also ``decide_agentrun``), CSRF on the form, and a cancel that races a decision
resolving exactly once through the guarded transitions."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from agentruns.exceptions import LeaseholdError
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.approvals.conftest import DECIDE, make_in_doubt_run, start_waiting_run

CANCEL = "agentruns.cancel_agentrun"
INBOX = reverse("approvals:inbox")


@pytest.fixture
def canceller(db):
    """A reviewer who may cancel anyone's runs."""
    return UserFactory(username="canceller", permissions=[DECIDE, CANCEL])


def cancel_url(run: AgentRun) -> str:
    return reverse("approvals:cancel", args=[run.uuid])


def test_the_card_offers_cancel_and_the_confirmation_changes_nothing(client, canceller, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(canceller)
    inbox = client.get(INBOX).content.decode()
    assert f'href="{cancel_url(run)}?next=/admin/approvals/"' in inbox
    page = client.get(cancel_url(run) + "?next=/admin/approvals/").content.decode()
    assert "Cancel run" in page and str(run.uuid) in page
    assert 'name="csrfmiddlewaretoken"' in page and 'value="/admin/approvals/"' in page
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_posting_the_confirmation_cancels_and_goes_back(client, canceller, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(canceller)
    response = client.post(cancel_url(run), {"next": INBOX}, follow=True)
    assert response.redirect_chain[-1][0] == INBOX
    assert "Run cancelled." in response.content.decode()
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    event = run.events.get(kind=EventKind.CANCEL)
    assert event.actor == canceller and event.payload["note"] == "cancelled in the approvals inbox"
    # Cancelled: the card is gone, and the timeline has nothing left to cancel.
    assert f"run-{run.uuid}" not in client.get(INBOX).content.decode()
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert cancel_url(run) not in timeline


def test_the_form_needs_its_csrf_token(canceller, initiator):
    run = start_waiting_run(initiator=initiator)
    client = Client(enforce_csrf_checks=True)
    client.force_login(canceller)
    assert client.post(cancel_url(run), {"next": INBOX}).status_code == 403
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_a_reviewer_without_the_cancel_permission_is_not_offered_it_and_is_refused(
    client, decider, initiator
):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    assert cancel_url(run) not in client.get(INBOX).content.decode()
    timeline = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert (
        f"you may not cancel it: cancelling a run someone else started needs {CANCEL}" in timeline
    )
    response = client.post(cancel_url(run), {"next": INBOX}, follow=True)
    assert f"needs {CANCEL}" in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_the_initiator_may_cancel_their_own_run(client, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(initiator)
    assert cancel_url(run) in client.get(INBOX).content.decode()
    client.post(cancel_url(run), {"next": INBOX})
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED


def test_a_run_in_doubt_needs_the_decide_permission_as_well(
    client, decider, initiator, monkeypatch
):
    """Only deciders reach the inbox; in the admin, someone who may cancel any run but not
    decide is refused a run in doubt, named per run, and the run stays in doubt."""
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    cancel_only = UserFactory(
        username="cancel-only",
        permissions=[CANCEL, "agentruns.view_all_agentruns", "agentruns.view_agentrun"],
    )
    client.force_login(cancel_only)
    assert client.get(cancel_url(run)).status_code == 302  # to the login: not a decider
    done = client.post(
        reverse("admin:agentruns_agentrun_changelist"),
        {"action": "cancel_runs", "_selected_action": [run.pk], "post": "yes"},
        follow=True,
    ).content.decode()
    assert f"cancelling a run in doubt needs {DECIDE}" in done
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_RECONCILIATION


def test_cancelling_a_run_that_already_ended_says_so(client, canceller, initiator):
    run = start_waiting_run(initiator=initiator)
    runs.run_cancel(run_uuid=run.uuid, actor=None, note="by the server")
    client.force_login(canceller)
    assert "already ended" in client.get(cancel_url(run)).content.decode()
    response = client.post(cancel_url(run), {"next": INBOX}, follow=True)
    assert "Nothing was cancelled: the run had already ended (cancelled)." in (
        response.content.decode()
    )
    assert run.events.filter(kind=EventKind.CANCEL).count() == 1


def test_a_hostile_next_or_an_unknown_run_is_no_500(client, canceller, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(canceller)
    response = client.post(cancel_url(run), {"next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == reverse(
        "approvals:run", args=[run.uuid]
    )
    missing = reverse("approvals:cancel", args=["00000000-0000-0000-0000-000000000000"])
    assert client.get(missing).status_code == 302
    assert client.post(missing, {"next": INBOX}).status_code == 302


# --- The admin ------------------------------------------------------------------------------


def test_the_admin_action_confirms_then_cancels_each_run_under_the_rules(
    client, canceller, initiator, monkeypatch
):
    waiting = start_waiting_run(initiator=initiator)
    other = start_waiting_run(initiator=initiator)
    changelist = reverse("admin:agentruns_agentrun_changelist")
    client.force_login(canceller)
    chosen = {"action": "cancel_runs", "_selected_action": [waiting.pk, other.pk]}
    confirm = client.post(changelist, chosen)
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Cancel these runs?" in html and 'name="post" value="yes"' in html
    assert AgentRun.objects.filter(status=Status.CANCELLED).count() == 0  # nothing yet
    done = client.post(changelist, {**chosen, "post": "yes"}, follow=True)
    assert "Cancelled 2 run(s); 0 had already ended." in done.content.decode()
    assert AgentRun.objects.filter(status=Status.CANCELLED).count() == 2


@pytest.mark.parametrize("first", ["0", "e"])  # the admin capitalises a message's first letter
def test_the_admin_action_reports_a_refusal_per_run(client, decider, initiator, first):
    run = start_waiting_run(initiator=initiator)
    AgentRun.objects.filter(pk=run.pk).update(uuid=first + str(run.uuid)[1:])
    run.refresh_from_db()
    changelist = reverse("admin:agentruns_agentrun_changelist")
    client.force_login(decider)  # may see every waiting run, may not cancel others'
    done = client.post(
        changelist,
        {"action": "cancel_runs", "_selected_action": [run.pk], "post": "yes"},
        follow=True,
    ).content.decode()
    shown = done[done.find('class="messagelist"') :][:600]
    assert f"Run {run.uuid}: not cancelled: cancelling a run someone else started needs" in shown, (
        shown
    )
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_a_reviewer_s_admin_lists_runs_and_events_and_links_the_inbox_and_playground(
    client, decider
):
    client.force_login(decider)
    index = client.get(reverse("admin:index")).content.decode()
    assert "You don’t have permission to view or edit anything" not in index
    assert reverse("admin:agentruns_agentrun_changelist") in index
    assert reverse("admin:agentruns_agentrunevent_changelist") in index
    assert reverse("approvals:inbox") in index and 'href="/playground/"' in index
    # "View site" goes to the front door, which leads each person to their page.
    assert '<a href="/">View site</a>' in index
    assert client.get(reverse("admin:agentruns_agentrun_changelist")).status_code == 200
    # Viewing, not changing.
    assert client.get(reverse("admin:agentruns_agentconfiguration_changelist")).status_code == 403


# --- A cancel racing a decision ----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(4))
def test_a_cancel_racing_a_decision_resolves_exactly_once(attempt):
    """Both act on the same waiting run at once, each in its own thread and connection. Either the
    cancel wins (the decision is refused: nothing is approved, nothing runs) or the decision
    wins (recorded, then the cancel ends the queued run); never both approved and running on."""
    initiator = UserFactory(username=f"init{attempt}", permissions=[DECIDE])
    approver = UserFactory(username=f"approver{attempt}", permissions=[DECIDE, CANCEL])
    run = start_waiting_run(initiator=initiator)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def act(name, call):
        try:
            barrier.wait()
            outcomes[name] = call()
        except LeaseholdError as exc:
            outcomes[name] = exc
        finally:
            connections.close_all()

    decide = threading.Thread(
        target=act,
        args=(
            "decide",
            lambda: runs.run_decide(
                run_uuid=run.uuid,
                actor=approver,
                approved=True,
                turn_digest=run.pending_turn["turn_digest"],
                mode="queued",
            ),
        ),
    )
    cancel = threading.Thread(
        target=act,
        args=(
            "cancel",
            lambda: runs.run_cancel(run_uuid=run.uuid, actor=approver, note="race"),
        ),
    )
    for thread in (decide, cancel):
        thread.start()
    for thread in (decide, cancel):
        thread.join(30)
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    assert outcomes["cancel"] is True
    events = list(AgentRunEvent.objects.filter(run=run).order_by("sequence"))
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.CANCEL) == 1
    if isinstance(outcomes["decide"], LeaseholdError):  # the cancel came first
        assert EventKind.APPROVAL not in kinds
    else:  # the decision came first and was recorded once; the cancel ended the queued run
        assert kinds.count(EventKind.APPROVAL) == 1
        assert kinds.index(EventKind.APPROVAL) < kinds.index(EventKind.CANCEL)
    # Whatever the order, a worker that wakes now runs nothing.
    assert runs.run_process_queued(run_uuid=run.uuid) is None
    assert not Note.objects.exists()
