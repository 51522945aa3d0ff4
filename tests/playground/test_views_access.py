"""Who may do what on the playground's run pages: the pending block offers what its reader may
decide (docs/design.md §5.6), as the inbox does; a run its reader may not see is 404 (§12.1)."""

from __future__ import annotations

import pytest

from agentruns.models import AgentRun, Status
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import WEBHOOK_SCRIPT, digest, waiting_for_approval
from tests.playground.conftest import DECIDE, USE

pytestmark = pytest.mark.django_db

WEBHOOKS = "playground.approve_webhooks"
MISSING = "approving call_webhook needs playground.approve_webhooks"
APPROVE = 'name="decision" value="approve"'
DENY = 'name="decision" value="deny"'


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


# --- Whose run pages one may open ----------------------------------------------------------------


def test_a_developer_who_may_not_decide_opens_only_their_own_runs(client):
    tinkerer = UserFactory(username="tinkerer", permissions=[USE])
    mine = waiting_for_approval(tinkerer)
    theirs = waiting_for_approval(UserFactory(username="someone"))
    client.force_login(tinkerer)

    assert run_page(client, mine).status_code == 200
    assert run_page(client, theirs).status_code == 404  # as for a run that does not exist
    history = client.get("/playground/").content.decode()
    assert str(mine.uuid) in history and str(theirs.uuid) not in history


@pytest.mark.parametrize("permission", [DECIDE, "agentruns.view_all_agentruns"])
def test_deciders_and_viewers_open_every_run(client, permission):
    staff = UserFactory(username="staff", permissions=[USE, permission])
    theirs = waiting_for_approval(UserFactory(username="someone"))
    client.force_login(staff)

    assert run_page(client, theirs).status_code == 200


def test_input_for_a_run_one_may_not_see_is_refused_as_not_found(client):
    theirs = waiting_for_approval(UserFactory(username="someone"))
    client.force_login(UserFactory(username="player", permissions=[USE]))

    response = client.post(f"/playground/runs/{theirs.uuid}/input/", {"turn_digest": "x"})

    assert response.status_code == 302  # back to the run page, which is 404 for them
    assert client.get(response["Location"]).status_code == 404
    assert AgentRun.objects.get(pk=theirs.pk).status == Status.WAITING_FOR_APPROVAL
