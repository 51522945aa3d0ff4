"""Approve / deny / reconcile from the inbox: post, redirect, a message for every outcome and for
every refusal — and a refusal changes nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, AgentRunEvent, Status, TerminationReason
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import make_in_doubt_run, start_input_run, start_waiting_run
from tests.approvals.support.html import sentences

pytestmark = pytest.mark.django_db

STALE = "The pending action changed — review again."
ALREADY = "Someone already decided this — nothing was changed."
SELF = "A colleague must approve; you may deny."


def shown_messages(response) -> list[str]:
    return sentences(response)


def decide(client, run, decision="approve", digest=None, **extra):
    data = {"decision": decision, "turn_digest": digest or card_digest(run)}
    return client.post(reverse("approvals:decide", args=[run.uuid]), {**data, **extra}, follow=True)


def assert_unchanged(run):
    before = (run.status, run.lease_epoch, run.pending_turn)
    run.refresh_from_db()
    assert (run.status, run.lease_epoch, run.pending_turn) == before
    assert not AgentRunEvent.objects.filter(run=run, kind="approval").exists()


def test_approve_queues_the_continuation_and_a_worker_completes_it(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = decide(client, run)
    assert response.redirect_chain == [(reverse("approvals:inbox"), 302)]
    assert shown_messages(response) == [
        "Approved. A worker continues the run; its timeline shows what happens next."
    ]
    run.refresh_from_db()
    assert run.status == Status.QUEUED
    event = AgentRunEvent.objects.get(run=run, kind="approval")
    assert event.actor == decider and event.payload["approved"] is True
    assert event.payload["mode"] == "queued"

    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert Note.objects.filter(title="Quarterly report").count() == 1


def test_deny_runs_nothing(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = decide(client, run, "deny")
    assert shown_messages(response)[0].startswith("Denied: none of the turn's calls runs")
    runs.run_process_queued(run_uuid=run.uuid)
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert not Note.objects.exists()
    assert AgentRunEvent.objects.get(run=run, kind="tool").payload["outcome"] == "denied"


def test_a_decision_returns_to_the_page_it_came_from_but_never_off_site(client, decider):
    first, second = start_waiting_run(initiator=decider), start_waiting_run(initiator=decider)
    client.force_login(decider)
    back = reverse("approvals:inbox") + "?kind=approval&page=1"
    assert decide(client, first, next=back).redirect_chain == [(back, 302)]
    offsite = decide(client, second, next="https://evil.example/")
    assert offsite.redirect_chain == [(reverse("approvals:inbox"), 302)]


def test_a_stale_digest_is_refused(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = decide(client, run, digest="0" * 64)
    assert shown_messages(response) == [STALE]
    assert_unchanged(run)


def test_a_missing_digest_is_refused_as_stale(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = client.post(
        reverse("approvals:decide", args=[run.uuid]), {"decision": "approve"}, follow=True
    )
    assert shown_messages(response) == [STALE]
    assert_unchanged(run)


def test_the_second_decision_on_a_turn_is_already_decided(client, decider, colleague, initiator):
    run = start_waiting_run(initiator=initiator)
    digest = card_digest(run)
    client.force_login(decider)
    decide(client, run, digest=digest)
    client.force_login(colleague)
    response = decide(client, run, "deny", digest=digest)
    assert shown_messages(response) == [ALREADY]
    assert AgentRunEvent.objects.filter(run=run, kind="approval").count() == 1


def test_self_approval_under_four_eyes_is_refused_but_self_denial_is_allowed(client, initiator):
    run = start_waiting_run(initiator=initiator, four_eyes=True)
    client.force_login(initiator)
    page = client.get(reverse("approvals:inbox")).content.decode()
    assert "You started this run." in page
    response = decide(client, run)
    assert shown_messages(response) == [SELF]
    assert_unchanged(run)

    response = decide(client, run, "deny")
    assert shown_messages(response)[0].startswith("Denied")
    run.refresh_from_db()
    assert run.status == Status.QUEUED


def test_a_run_that_is_not_waiting_anymore(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    digest = card_digest(run)
    runs.run_cancel(run_uuid=run.uuid)
    client.force_login(decider)
    response = decide(client, run, digest=digest)
    assert shown_messages(response) == [
        "This run is not waiting for that decision anymore (it is now cancelled) — nothing was "
        "changed."
    ]


def test_an_unknown_run(client, decider):
    import uuid

    client.force_login(decider)
    response = client.post(
        reverse("approvals:decide", args=[uuid.uuid4()]),
        {"decision": "approve", "turn_digest": "x"},
        follow=True,
    )
    assert shown_messages(response) == ["That run does not exist."]


def test_an_incomplete_form_is_refused(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    response = decide(client, run, "maybe")
    assert shown_messages(response) == [
        "The form was incomplete — nothing was changed. Review the run and try again."
    ]
    assert_unchanged(run)


def test_approving_an_input_run_is_not_waiting(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    response = decide(client, run)
    assert (
        "not waiting for that decision anymore (it is now waiting for input)"
        in (shown_messages(response)[0])
    )


def test_a_get_cannot_decide(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    assert client.get(reverse("approvals:decide", args=[run.uuid])).status_code == 405


# --- Reconciliation -------------------------------------------------------------------------------


def reconcile(client, run, verdict, digest=None):
    return client.post(
        reverse("approvals:reconcile", args=[run.uuid]),
        {"verdict": verdict, "turn_digest": digest or card_digest(run)},
        follow=True,
    )


def test_reconcile_landed_continues_without_running_the_write_again(
    client, decider, initiator, monkeypatch
):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    client.force_login(decider)
    response = reconcile(client, run, "landed")
    assert shown_messages(response)[0].startswith("Recorded: the call took effect.")
    event = AgentRunEvent.objects.get(run=run, kind="reconciliation")
    assert event.actor == decider and event.payload["verdict"] == "landed"
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert not Note.objects.exists()  # the dead segment never wrote it; nobody re-ran it


def test_reconcile_not_landed(client, decider, initiator, monkeypatch):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    client.force_login(decider)
    response = reconcile(client, run, "not_landed")
    assert "did not take effect" in shown_messages(response)[0]
    run.refresh_from_db()
    assert run.status == Status.QUEUED


def test_reconcile_abandon_settles_the_run(client, decider, initiator, monkeypatch):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    client.force_login(decider)
    response = reconcile(client, run, "abandon")
    assert shown_messages(response) == [
        "Run abandoned: it ended as failed (abandoned during reconciliation)."
    ]
    run.refresh_from_db()
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.RECONCILED_ABANDONED,
    )


def test_reconcile_refusals(client, decider, colleague, initiator, monkeypatch):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    digest = card_digest(run)
    client.force_login(decider)
    assert shown_messages(reconcile(client, run, "landed", digest="f" * 64)) == [STALE]
    assert shown_messages(reconcile(client, run, "sideways")) == [
        "The form was incomplete — nothing was changed. Review the run and try again."
    ]
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    reconcile(client, run, "landed", digest=digest)
    client.force_login(colleague)
    assert shown_messages(reconcile(client, run, "abandon", digest=digest)) == [ALREADY]
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED
