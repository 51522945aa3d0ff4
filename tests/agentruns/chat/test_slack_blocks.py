"""The Block Kit message a configuration's notification webhook posts (README "Deciding from email
and Slack"): per waiting run what waits and its buttons — Approve only where chat may approve,
Deny for an approval, Open (the channel's signed review link) — chosen text escaped, and within
Slack's limits. Posted to a real local HTTP server."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns.chat.slack_blocks import APPROVE, BLOCK_ITEMS, DENY, OPEN, webhook_blocks
from agentruns.models import AgentRun
from agentruns.notification_text import item_for
from agentruns.services.notifications import notifications_send
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory
from tests.approvals.conftest import DECIDE

pytestmark = pytest.mark.django_db

SITE = "http://testserver"


def agentruns(**values):
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE, **values})


def actions_of(blocks) -> list[list[str]]:
    return [
        [button["action_id"] for button in block["elements"]]
        for block in blocks
        if block["type"] == "actions"
    ]


def test_the_webhook_message_carries_buttons_per_run_and_its_open_link_reviews_the_run(
    http_recorder, client
):
    configuration = AgentConfigurationFactory(
        name="<!channel> deploys",
        allow_chat_approval=True,
        notify_webhook_url=http_recorder.url("/hooks/leasehold"),
    )
    approval = AgentRunFactory(configuration=configuration, waiting=True)
    asking = AgentRunFactory(configuration=configuration, waiting_for_input=True)
    with agentruns(WEBHOOK_ALLOWLIST=[http_recorder.netloc], NOTIFY_EMAIL=False):
        assert notifications_send().sent == {"webhook": 1}
    body = json.loads(http_recorder.requests[0].body)
    blocks = body["blocks"]
    assert "&lt;!channel&gt; deploys" in blocks[0]["text"]["text"]
    by_run = {block["block_id"]: block for block in blocks if "block_id" in block}
    approve_row = by_run[f"leasehold:actions:{approval.uuid}"]["elements"]
    assert [b["action_id"] for b in approve_row] == [APPROVE, DENY, OPEN]
    digest = approval.pending_turn["turn_digest"]
    assert approve_row[0]["value"] == approve_row[1]["value"] == f"{approval.uuid}:{digest}"
    assert approve_row[0]["confirm"]["confirm"]["text"] == "Approve"
    assert [b["action_id"] for b in by_run[f"leasehold:actions:{asking.uuid}"]["elements"]] == [
        OPEN
    ]  # input is given on its card

    # Open is the channel's signed link: any decider signing in reviews the run there.
    link = approve_row[2]["url"].removeprefix(SITE)
    client.force_login(UserFactory(permissions=[DECIDE]))
    page = client.get(link)
    assert page.status_code == 200 and f'id="run-{approval.uuid}"' in page.content.decode()


def test_without_a_site_url_there_is_no_open_button_slack_would_refuse(db):
    run = AgentRunFactory(waiting=True)
    run = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": ""}):
        blocks = webhook_blocks(label="x", new=[item_for(run)])
    assert actions_of(blocks) == [[DENY]]


def test_a_long_message_stays_within_slacks_fifty_blocks(db):
    configuration = AgentConfigurationFactory(allow_chat_approval=True)
    for _ in range(BLOCK_ITEMS + 5):
        AgentRunFactory(configuration=configuration, waiting=True)
    items = [
        item_for(run) for run in AgentRun.objects.select_related("configuration").order_by("pk")
    ]
    with agentruns():
        blocks = webhook_blocks(label="many", new=items)
    assert len(blocks) <= 50
    assert len(actions_of(blocks)) == BLOCK_ITEMS
    assert blocks[-1]["type"] == "context" and "… and 5 more" in blocks[-1]["elements"][0]["text"]
