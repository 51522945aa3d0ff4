"""Signed review links (README "Deciding from email and Slack"): the link a digest carries opens a
confirmation page — login required, as its recipient — showing the run's whole card with its
verdict buttons; opening it decides nothing. A link for another account, another run, an altered
or foreign token, an expired link, a changed turn and a decided run each say so. Real runs made
by the runtime; on both databases."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.core import mail, signing
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.notification_text import item_for
from agentruns.review_links import PERSON_SALT, review_token
from agentruns.services import runs
from agentruns.services.notifications import notifications_send
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import DECIDE, start_input_run, start_waiting_run
from tests.approvals.test_views_decisions import shown_messages

pytestmark = pytest.mark.django_db

SITE = "http://testserver"


def link_for(run: AgentRun, user, **extra) -> str:
    """The path of the link a digest sends ``user`` for ``run``'s wait."""
    run = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    token = review_token(run=run, turn_digest=card_digest(run), user_id=user.pk, **extra)
    return reverse("approvals:review", args=[run.uuid, token])


def approval_events(run: AgentRun) -> int:
    return AgentRunEvent.objects.filter(run=run, kind="approval").count()


# --- The digest carries it ------------------------------------------------------------------------


def test_the_email_digest_carries_each_recipient_their_own_link_and_it_opens_the_card(client):
    from tests.agentruns.factories import UserFactory

    alice = UserFactory(username="alice", email="alice@example.com", permissions=[DECIDE])
    bob = UserFactory(username="bob", email="bob@example.com", permissions=[DECIDE])
    run = start_waiting_run(initiator=bob)
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE}):
        assert notifications_send().sent == {"email": 2}
    links = {
        message.to[0]: re.search(r"review and decide: (\S+)", message.body).group(1)
        for message in mail.outbox
    }
    assert set(links) == {"alice@example.com", "bob@example.com"}
    assert links["alice@example.com"] != links["bob@example.com"]  # bound to the recipient
    alices = links["alice@example.com"].removeprefix(SITE)
    assert alices.startswith(f"/admin/approvals/runs/{run.uuid}/review/")

    client.force_login(alice)
    page = client.get(alices)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="run-{run.uuid}"' in html  # the whole card, preview included
    assert "What will change:" in html and "creates a note titled" in html
    assert 'value="approve"' in html and 'value="deny"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert approval_events(run) == 0  # opening it decided nothing
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL

    client.force_login(bob)
    assert client.get(alices).status_code == 403  # alice's, not bob's


# --- The confirmation page ------------------------------------------------------------------------


def test_approving_from_the_page_decides_through_the_inbox_and_returns_to_the_run(
    client, decider, initiator
):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    page = client.get(link_for(run, decider))
    assert page.status_code == 200 and page.context["card"] is not None
    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": card_digest(run), "next": page.context["next"]},
        follow=True,
    )
    assert response.redirect_chain == [(reverse("approvals:run", args=[run.uuid]), 302)]
    assert shown_messages(response)[0].startswith("Approved.")
    event = AgentRunEvent.objects.get(run=run, kind="approval")
    assert event.actor == decider and event.payload["approved"] is True


def test_the_page_is_csrf_protected_and_never_decides_on_a_get(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(decider)
    assert browser.get(link_for(run, decider)).status_code == 200
    forged = browser.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": card_digest(run)},
    )
    assert forged.status_code == 403  # no CSRF token: refused before any view
    client.force_login(decider)
    assert client.post(link_for(run, decider)).status_code == 405  # the page is GET only
    assert client.get(reverse("approvals:decide", args=[run.uuid])).status_code == 405
    assert approval_events(run) == 0


def test_a_signed_out_recipient_signs_in_first_then_sees_the_card(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    link = link_for(run, decider)
    response = client.get(link)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert "next=" in response["Location"]
    client.force_login(decider)
    assert client.get(link).status_code == 200


def test_an_input_request_opens_its_form_too(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    html = client.get(link_for(run, decider)).content.decode()
    assert "Which priority?" in html and reverse("approvals:input", args=[run.uuid]) in html


# --- Refusals -------------------------------------------------------------------------------------


def test_another_account_gets_a_clear_refusal_and_sees_nothing_of_the_run(
    client, decider, colleague, initiator
):
    run = start_waiting_run(initiator=initiator)
    client.force_login(colleague)
    response = client.get(link_for(run, decider))
    assert response.status_code == 403
    html = response.content.decode()
    assert "This review link was sent to another account" in html
    assert "You are signed in as <strong>colleague</strong>" in html
    assert "creates a note titled" not in html and 'value="approve"' not in html


def test_an_expired_link_says_when_it_expired(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    expired_at = timezone.now() - timedelta(minutes=5)
    client.force_login(decider)
    response = client.get(link_for(run, decider, expires_at=expired_at))
    assert response.status_code == 410
    html = response.content.decode()
    assert f"This review link expired at {expired_at:%Y-%m-%d %H:%M} UTC" in html
    assert 'value="approve"' not in html
    assert reverse("approvals:run", args=[run.uuid]) in html


def test_by_default_a_link_expires_at_the_approval_deadline_or_after_a_day(decider, initiator):
    from agentruns.review_links import LIFETIME, review_link_read

    timed = start_waiting_run(
        initiator=initiator,
        configuration=AgentConfigurationFactory(approval_timeout=timedelta(minutes=30)),
    )
    untimed = start_waiting_run(initiator=initiator)
    for run, expected in (
        (timed, AgentRun.objects.get(pk=timed.pk).approval_deadline),
        (untimed, timezone.now() + LIFETIME),
    ):
        token = review_token(run=run, turn_digest=card_digest(run), user_id=decider.pk)
        link = review_link_read(token=token, run_uuid=run.uuid, user=decider)
        assert abs((link.expires_at - expected).total_seconds()) < 5


def test_a_token_for_another_run_an_altered_one_or_one_signed_for_another_purpose_is_refused(
    client, decider, initiator
):
    run, other = start_waiting_run(initiator=initiator), start_waiting_run(initiator=initiator)
    client.force_login(decider)
    token = link_for(other, decider).rstrip("/").rsplit("/", 1)[1]
    foreign = signing.dumps(
        {"r": str(run.uuid), "d": card_digest(run), "e": 2**40, "u": decider.pk},
        salt="some.other.purpose",
    )
    tampered = (
        signing.dumps(
            {"r": str(run.uuid), "d": card_digest(run), "e": 2**40, "u": decider.pk},
            salt=PERSON_SALT,
        )[:-3]
        + "AAA"
    )
    for bad in (token, foreign, tampered, "not-a-token"):
        response = client.get(reverse("approvals:review", args=[run.uuid, bad]))
        assert response.status_code == 404, bad
        assert "This review link is not valid" in response.content.decode() or (
            "made for another run" in response.content.decode()
        )
        assert 'value="approve"' not in response.content.decode()


def test_a_link_to_a_turn_that_changed_says_so_and_links_to_the_run(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    stale = review_token(run=run, turn_digest="0" * 64, user_id=decider.pk)
    client.force_login(decider)
    response = client.get(reverse("approvals:review", args=[run.uuid, stale]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "now waits for something else" in html
    assert reverse("approvals:run", args=[run.uuid]) in html
    assert 'value="approve"' not in html


def test_a_link_to_a_decided_run_says_so_and_links_to_the_run(client, decider, initiator):
    run = start_waiting_run(initiator=initiator)
    link = link_for(run, decider)
    runs.run_decide(
        run_uuid=run.uuid,
        actor=decider,
        approved=False,
        turn_digest=card_digest(run),
        mode="queued",
    )
    client.force_login(decider)
    response = client.get(link)
    assert response.status_code == 200
    html = response.content.decode()
    assert "no longer waits for a decision" in html and "It is queued" in html
    assert reverse("approvals:run", args=[run.uuid]) in html
    assert 'value="approve"' not in html


def test_a_link_whose_deadline_passed_is_expired(client, decider, initiator):
    run = start_waiting_run(
        initiator=initiator,
        configuration=AgentConfigurationFactory(approval_timeout=timedelta(minutes=30)),
    )
    link = link_for(run, decider)
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))
    client.force_login(decider)
    assert client.get(link).status_code == 200  # the token carries the deadline it was made with
    run.refresh_from_db()
    client.force_login(decider)
    assert client.get(link_for(run, decider)).status_code == 410


def test_the_channel_link_of_a_webhook_opens_for_any_decider_and_is_no_persons_link(
    client, decider, colleague, initiator
):
    run = start_waiting_run(initiator=initiator)
    run = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    item = item_for(run)
    channel = review_token(
        run=run, turn_digest=item.pending.turn_digest, configuration_id=run.configuration_id
    )
    path = reverse("approvals:review", args=[run.uuid, channel])
    for person in (decider, colleague):
        client.force_login(person)
        assert client.get(path).status_code == 200
    other = AgentConfigurationFactory()
    forged = review_token(run=run, turn_digest=item.pending.turn_digest, configuration_id=other.pk)
    assert client.get(reverse("approvals:review", args=[run.uuid, forged])).status_code == 404
