"""Who may do what on the playground's run pages: the pending block offers what its reader may
decide (docs/design.md §5.6), as the inbox does."""

from __future__ import annotations

import pytest

from agentruns.models import AgentRun, Status
from tests.agentruns.api_support import WEBHOOK_SCRIPT, digest, waiting_for_approval
from tests.agentruns.factories import UserFactory
from tests.playground.conftest import DECIDE, USE

pytestmark = pytest.mark.django_db

WEBHOOKS = "playground.approve_webhooks"
MISSING = "approving call_webhook needs playground.approve_webhooks"
APPROVE = 'name="approved" value="1"'
DENY = 'name="approved" value="0"'


def run_page(client, run: AgentRun):
    return client.get(f"/playground/runs/{run.uuid}/")


# --- What the pending block offers ---------------------------------------------------------------


def test_a_developer_without_the_tool_s_permission_sees_deny_only_and_what_is_missing(
    client, developer
):
    run = waiting_for_approval(developer, script=WEBHOOK_SCRIPT)
    client.force_login(developer)

    html = run_page(client, run).content.decode()

    assert DENY in html and APPROVE not in html
    assert f"You may not approve this turn:</strong> {MISSING}. You may deny it." in html


def test_a_developer_with_the_permission_sees_approve_and_deny(client):
    approver = UserFactory(username="approver", permissions=[USE, DECIDE, WEBHOOKS])
    run = waiting_for_approval(approver, script=WEBHOOK_SCRIPT)
    client.force_login(approver)

    html = run_page(client, run).content.decode()

    assert DENY in html and APPROVE in html and "You may not approve" not in html


def test_a_developer_who_may_not_decide_sees_no_buttons_and_why(client):
    tinkerer = UserFactory(username="tinkerer", permissions=[USE])
    run = waiting_for_approval(tinkerer)
    client.force_login(tinkerer)

    html = run_page(client, run).content.decode()

    assert DENY not in html and APPROVE not in html
    assert "approving needs agentruns.decide_agentrun" in html


def test_approving_anyway_is_refused_with_the_missing_permission(client, developer):
    run = waiting_for_approval(developer, script=WEBHOOK_SCRIPT)
    client.force_login(developer)

    response = client.post(
        f"/playground/runs/{run.uuid}/decision/",
        {"approved": "1", "turn_digest": digest(run)},
        follow=True,
    )

    assert MISSING in response.content.decode()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
