"""Approver authority in the inbox (docs/design.md §5.6): a card its reader may not approve shows
*Deny* only (or *Abandon* only, for an in-doubt call) and a line naming what is missing; a POST
that tries anyway is refused with that sentence, and nothing changes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentruns.models import AgentConfiguration, AgentRun, Status
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import WEBHOOK_CALL, in_doubt
from tests.approvals.conftest import DECIDE, bulk_waiting_runs, start_waiting_run

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")
WEBHOOKS = "playground.approve_webhooks"
MISSING = "approving call_webhook needs playground.approve_webhooks"
APPROVE = '<button type="submit" name="decision" value="approve"'
DENY = '<button type="submit" name="decision" value="deny"'
WEBHOOK = {"url": "http://hooks.invalid/", "payload": {}}


def card_html(client, run: AgentRun, path: str = INBOX) -> str:
    html = client.get(path).content.decode()
    start = html.index(f'id="run-{run.uuid}"')
    return html[start : html.index("</article>", start)]


def webhook_run(**config_fields) -> AgentRun:
    return start_waiting_run(
        tool="call_webhook",
        arguments=WEBHOOK,
        configuration=AgentConfigurationFactory(**config_fields),
    )


def test_a_reader_without_the_tool_s_permission_sees_deny_only_and_what_is_missing(client):
    run = webhook_run()
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    card = card_html(client, run)

    assert DENY in card and APPROVE not in card
    assert "You may not approve this turn:</strong> " + MISSING + ". You may deny it." in card
    assert f'aria-describedby="card-{run.pk}-missing"' in card


def test_a_reader_with_the_permission_sees_both_buttons_and_no_missing_line(client):
    run = webhook_run()
    client.force_login(UserFactory(username="approver", permissions=[DECIDE, WEBHOOKS]))

    card = card_html(client, run)

    assert DENY in card and APPROVE in card
    assert "You may not approve" not in card


def test_the_run_page_shows_the_same_card(client):
    run = webhook_run()
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    card = card_html(client, run, reverse("approvals:run", args=[run.uuid]))

    assert DENY in card and APPROVE not in card and MISSING in card


def test_a_card_of_a_grouped_configuration_names_the_group(client):
    group = Group.objects.create(name="Release managers")
    run = start_waiting_run(
        configuration=AgentConfigurationFactory(slug="releases", approver_group=group)
    )
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    card = card_html(client, run)

    assert APPROVE not in card
    group_line = (
        "approving runs of releases needs membership of the group &#x27;Release managers&#x27;"
    )
    assert group_line in card


def test_an_in_doubt_webhook_offers_abandon_only_to_a_reader_without_the_permission(client):
    run = in_doubt(call=WEBHOOK_CALL)
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    card = card_html(client, run)

    assert 'value="abandon"' in card
    assert 'value="landed"' not in card and 'value="not_landed"' not in card
    assert (
        "You may not say whether this call landed:</strong> reconciling call_webhook needs "
        "playground.approve_webhooks. You may abandon the run."
    ) in card


def test_approving_anyway_is_refused_with_the_missing_permission_and_changes_nothing(client):
    run = webhook_run()
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": run.pending_turn["turn_digest"]},
        follow=True,
    )

    assert f"Not permitted — nothing was changed: {MISSING}." in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    assert not run.events.filter(kind="approval").exists()


def test_denying_is_allowed_without_the_tool_s_permission(client):
    run = webhook_run()
    client.force_login(UserFactory(username="colleague", permissions=[DECIDE]))

    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "deny", "turn_digest": run.pending_turn["turn_digest"]},
        follow=True,
    )

    assert "Denied" in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED


def test_cards_with_a_group_cost_the_same_queries_for_5_and_500_runs(client):
    group = Group.objects.create(name="approvers")
    reader = UserFactory(username="reader", permissions=[DECIDE])
    client.force_login(reader)
    client.get(INBOX)

    bulk_waiting_runs(5)
    AgentConfiguration.objects.update(approver_group=group)
    with CaptureQueriesContext(connection) as five:
        assert client.get(INBOX).content.decode().count("You may not approve") == 5

    bulk_waiting_runs(495)
    AgentConfiguration.objects.update(approver_group=group)
    with CaptureQueriesContext(connection) as five_hundred:
        assert client.get(INBOX).content.decode().count("You may not approve") == 20

    assert len(five_hundred.captured_queries) == len(five.captured_queries)
