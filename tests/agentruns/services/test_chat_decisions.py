"""Slack interactivity (README "Deciding from email and Slack"): button presses signed exactly as
Slack signs them (HMAC-SHA256 of ``v0:<timestamp>:<body>`` under the app's signing secret) are
posted to the real endpoint through Django's test client; the reply to Slack's ``response_url``
goes to a real local HTTP server. Valid, wrong secret, replayed after five minutes, another
user, unknown user — and the rules of every decision (authority, four-eyes, deadline) with those
of chat (``allow_chat_approval``, no failed preview). On both databases."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime, timedelta
from io import StringIO
from typing import Any
from urllib.parse import urlencode

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db.models.functions import Now
from django.test import override_settings
from django.urls import reverse

from agentruns.chat.slack_blocks import APPROVE, DENY, OPEN, webhook_blocks
from agentruns.models import AgentRun, AgentRunEvent, Effect, SlackUser, Status
from agentruns.notification_text import item_for
from agentruns.tools import Tool, ToolContext, registry
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import DECIDE, start_waiting_run

pytestmark = pytest.mark.django_db

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
URL = "/integrations/slack/interactivity/"
SITE = "http://testserver"


@pytest.fixture
def slack(monkeypatch, http_recorder):
    """The signing secret set, absolute links, and the recorder allowed as ``response_url``."""
    monkeypatch.setenv("LEASEHOLD_SLACK_SIGNING_SECRET", SECRET)
    values = {"SITE_URL": SITE, "WEBHOOK_ALLOWLIST": [http_recorder.netloc]}
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, **values}):
        yield http_recorder


@pytest.fixture
def alice(db):
    user = UserFactory(username="alice", permissions=[DECIDE])
    SlackUser.objects.create(slack_user_id="U0ALICE", user=user)
    return user


@pytest.fixture
def bob(db):
    return UserFactory(username="bob", permissions=[DECIDE])


def chat_run(*, initiator=None, **configuration: Any) -> AgentRun:
    config = AgentConfigurationFactory(**{"allow_chat_approval": True, **configuration})
    run = start_waiting_run(initiator=initiator, configuration=config)
    return AgentRun.objects.select_related("configuration").get(pk=run.pk)


def message_blocks(run: AgentRun) -> list[dict[str, Any]]:
    """The blocks of the webhook message that announced ``run`` (as Slack sends them back)."""
    run = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    return webhook_blocks(label=str(run.configuration), new=[item_for(run)])


def body_of(
    run: AgentRun,
    slack,
    *,
    action_id: str = APPROVE,
    user: str = "U0ALICE",
    digest: str | None = None,
) -> bytes:
    """A ``block_actions`` payload as Slack posts it: form-encoded, the JSON in ``payload``."""
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "token": "deprecated-verification-token",
        "container": {"type": "message", "message_ts": "1700000000.000100", "channel_id": "C0"},
        "trigger_id": "1.2.3",
        "team": {"id": "T0TEAM", "domain": "example"},
        "channel": {"id": "C0", "name": "approvals"},
        "response_url": slack.url("/actions/T0TEAM/1/secret"),
        "message": {"type": "message", "text": "Leasehold: 1 run", "blocks": message_blocks(run)},
        "actions": [
            {
                "action_id": action_id,
                "block_id": f"leasehold:actions:{run.uuid}",
                "value": f"{run.uuid}:{digest or card_digest(run)}",
                "type": "button",
                "action_ts": "1700000001.000200",
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: bytes, *, secret: str = SECRET, timestamp: int | None = None) -> dict[str, str]:
    """The headers Slack adds: the timestamp and ``v0=`` HMAC-SHA256 of ``v0:ts:body``."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + ts.encode() + b":" + body
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": ts, "HTTP_X_SLACK_SIGNATURE": signature}


def press(client, body: bytes, headers: dict[str, str]):
    return client.post(URL, data=body, content_type="application/x-www-form-urlencoded", **headers)


def replies(slack) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in slack.requests]


def decisions(run: AgentRun) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run=run, kind="approval"))


def still_waiting(run: AgentRun) -> bool:
    return AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


# --- Valid presses --------------------------------------------------------------------------------


def test_a_valid_approve_decides_as_the_linked_account_and_updates_the_message(
    client, slack, alice, bob
):
    run = chat_run(initiator=bob)
    body = body_of(run, slack)
    response = press(client, body, signed(body))
    assert response.status_code == 200 and response.content == b""

    [event] = decisions(run)
    assert event.actor == alice and event.payload["approved"] is True
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED
    [request] = slack.requests
    assert (request.method, request.path) == ("POST", "/actions/T0TEAM/1/secret")
    [reply] = replies(slack)
    assert reply["replace_original"] is True
    assert reply["text"].startswith("Approved by alice at ") and "(<@U0ALICE>)" in reply["text"]
    # The run's buttons became what happened; the rest of the message is as it was.
    original = message_blocks(run)
    assert len(reply["blocks"]) == len(original)
    assert reply["blocks"][0] == original[0]
    assert not any(block["type"] == "actions" for block in reply["blocks"])
    assert reply["blocks"][-1] == {
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": reply["text"]}],
    }


def test_deny_needs_no_chat_approval_and_runs_nothing(client, slack, alice, bob):
    run = chat_run(initiator=bob, allow_chat_approval=False)
    body = body_of(run, slack, action_id=DENY)
    assert press(client, body, signed(body)).status_code == 200
    [event] = decisions(run)
    assert event.actor == alice and event.payload["approved"] is False
    assert replies(slack)[0]["text"].startswith("Denied by alice")


# --- Signatures -----------------------------------------------------------------------------------


def test_a_request_signed_with_another_secret_is_refused_and_decides_nothing(client, slack, alice):
    run = chat_run()
    body = body_of(run, slack)
    response = press(client, body, signed(body, secret="not-the-app-secret-0000000000000"))
    assert response.status_code == 401
    assert decisions(run) == [] and still_waiting(run) and slack.requests == []


def test_a_request_replayed_after_five_minutes_is_refused(client, slack, alice):
    run = chat_run()
    body = body_of(run, slack)
    headers = signed(body)  # signed now, as Slack sent it
    with time_machine.travel(datetime.now().astimezone() + timedelta(minutes=5, seconds=2)):
        assert press(client, body, headers).status_code == 401
    old = signed(body, timestamp=int(time.time()) - 301)  # or signed long ago
    assert press(client, body, old).status_code == 401
    assert decisions(run) == [] and still_waiting(run) and slack.requests == []


def test_an_altered_body_missing_headers_or_a_bad_timestamp_are_refused(client, slack, alice):
    run = chat_run()
    body = body_of(run, slack)
    headers = signed(body)
    assert press(client, body_of(run, slack, action_id=DENY), headers).status_code == 401
    assert press(client, body, {}).status_code == 401
    assert press(
        client, body, {**headers, "HTTP_X_SLACK_REQUEST_TIMESTAMP": "soon"}
    ).status_code == (401)
    assert decisions(run) == [] and slack.requests == []


def test_without_a_secret_the_endpoint_is_off_and_it_never_answers_a_get(
    client, monkeypatch, alice
):
    run = chat_run()
    monkeypatch.delenv("LEASEHOLD_SLACK_SIGNING_SECRET", raising=False)
    body = b"payload=%7B%7D"
    assert press(client, body, signed(body)).status_code == 404
    monkeypatch.setenv("LEASEHOLD_SLACK_SIGNING_SECRET", SECRET)
    assert client.get(URL).status_code == 405
    assert decisions(run) == []


def test_a_signed_body_that_is_no_button_press_is_refused(client, slack):
    for body in (
        b"payload=not-json",
        urlencode({"payload": json.dumps({"type": "view_submission"})}).encode(),
        b"",
    ):
        assert press(client, body, signed(body)).status_code == 400


# --- Who presses ----------------------------------------------------------------------------------


def test_an_unknown_slack_user_is_refused_and_told_so_alone(client, slack, alice):
    run = chat_run()
    body = body_of(run, slack, user="U0NOBODY")
    assert press(client, body, signed(body)).status_code == 200
    assert decisions(run) == [] and still_waiting(run)
    [reply] = replies(slack)
    assert reply["replace_original"] is False and reply["response_type"] == "ephemeral"
    assert "Your Slack account is not linked to a Leasehold account" in reply["text"]
    assert "slack_users link" in reply["text"]


def test_another_user_without_the_authority_is_refused_and_told_why(client, slack, alice):
    approvers = Group.objects.create(name="approvers")
    alice.groups.add(approvers)
    carol = UserFactory(username="carol", permissions=[DECIDE])  # not in the group
    SlackUser.objects.create(slack_user_id="U0CAROL", user=carol)
    run = chat_run(approver_group=approvers)
    body = body_of(run, slack, user="U0CAROL")
    press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    [reply] = replies(slack)
    assert reply["response_type"] == "ephemeral"
    assert "needs membership of the group 'approvers'" in reply["text"]
    # The linked member of the group may.
    body = body_of(run, slack, user="U0ALICE")
    press(client, body, signed(body))
    assert [event.actor for event in decisions(run)] == [alice]


def test_four_eyes_holds_from_slack_too(client, slack, alice):
    run = chat_run(initiator=alice, require_second_approver=True)
    body = body_of(run, slack)
    press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    assert "A colleague must approve; you may deny." in replies(slack)[0]["text"]
    deny = body_of(run, slack, action_id=DENY)
    press(client, deny, signed(deny))
    assert [event.payload["approved"] for event in decisions(run)] == [False]


def test_an_inactive_or_non_staff_account_decides_nothing(client, slack, alice):
    run = chat_run()
    for change in ({"is_staff": False}, {"is_active": False}):
        type(alice).objects.filter(pk=alice.pk).update(**{"is_staff": True, "is_active": True})
        type(alice).objects.filter(pk=alice.pk).update(**change)
        body = body_of(run, slack)
        press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    assert all(reply["response_type"] == "ephemeral" for reply in replies(slack))


# --- What chat may approve ------------------------------------------------------------------------


def test_approving_from_chat_is_off_by_default_and_the_message_offers_open_instead(
    client, slack, alice
):
    run = chat_run(allow_chat_approval=False)
    [actions] = [block for block in message_blocks(run) if block["type"] == "actions"]
    assert [button["action_id"] for button in actions["elements"]] == [DENY, OPEN]
    body = body_of(run, slack)  # a press crafted for a button the message never had
    press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    [reply] = replies(slack)
    assert reply["response_type"] == "ephemeral"
    assert "does not allow approving from chat" in reply["text"]


@pytest.fixture
def failing_preview():
    def raises(context: ToolContext, arguments: dict[str, Any]) -> Any:
        raise LookupError("no such target")

    tool = Tool(
        name="preview_raises",
        description="A write whose preview fails.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.IDEMPOTENT_WRITE,
        func=lambda context, arguments: {"done": True},
        preview=raises,
    )
    registry.register(tool)
    yield tool
    registry.unregister(tool.name)


def test_a_turn_whose_preview_failed_is_never_approved_from_chat(
    client, slack, alice, failing_preview
):
    from agentruns.services import runs

    config = AgentConfigurationFactory(allow_chat_approval=True)
    result = runs.run_start_sync(
        configuration=config,
        prompt="p",
        options={"script": [{"tool_calls": [{"name": "preview_raises", "arguments": {}}]}]},
    )
    run = AgentRun.objects.get(pk=result.run.pk)
    assert run.status == Status.WAITING_FOR_APPROVAL
    [actions] = [block for block in message_blocks(run) if block["type"] == "actions"]
    assert APPROVE not in [button["action_id"] for button in actions["elements"]]
    body = body_of(run, slack)
    press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    assert "the preview of preview_raises failed" in replies(slack)[0]["text"]


# --- The run moved on -----------------------------------------------------------------------------


def test_a_second_press_or_a_changed_turn_updates_the_message_with_why(client, slack, alice, bob):
    run = chat_run()
    stale = body_of(run, slack, digest="0" * 64)
    press(client, stale, signed(stale))
    assert decisions(run) == []
    first = replies(slack)[0]
    assert first["replace_original"] is True  # the buttons are stale for everyone
    assert "pending action changed" in first["text"]

    SlackUser.objects.create(slack_user_id="U0BOB", user=bob)
    # Both press the buttons of the same message.
    bodies = [body_of(run, slack, user=user) for user in ("U0ALICE", "U0BOB")]
    for body in bodies:
        press(client, body, signed(body))
    assert [event.actor for event in decisions(run)] == [alice]
    last = replies(slack)[-1]
    assert last["replace_original"] is True
    assert last["text"].startswith("Not decided: ") and "already decided" in last["text"]


def test_past_its_deadline_a_press_is_refused_as_anywhere(client, slack, alice):
    run = chat_run(approval_timeout=timedelta(minutes=30))
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))
    body = body_of(run, slack)
    press(client, body, signed(body))
    assert decisions(run) == [] and still_waiting(run)
    assert "approval deadline passed" in replies(slack)[0]["text"]


def test_open_is_a_link_and_a_press_on_it_decides_nothing(client, slack, alice):
    run = chat_run()
    [actions] = [block for block in message_blocks(run) if block["type"] == "actions"]
    [open_button] = [b for b in actions["elements"] if b["action_id"] == OPEN]
    assert open_button["url"].startswith(f"{SITE}/admin/approvals/runs/{run.uuid}/review/")
    body = body_of(run, slack, action_id=OPEN)
    assert press(client, body, signed(body)).status_code == 200
    assert decisions(run) == [] and slack.requests == []


def test_a_reply_url_outside_slack_and_the_allowlist_is_never_called(
    client, monkeypatch, http_recorder, alice
):
    monkeypatch.setenv("LEASEHOLD_SLACK_SIGNING_SECRET", SECRET)
    run = chat_run()
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": []}):
        body = body_of(run, http_recorder)
        assert press(client, body, signed(body)).status_code == 200
    assert [event.actor for event in decisions(run)] == [alice]  # the decision stands
    assert http_recorder.requests == []


# --- Linking accounts -----------------------------------------------------------------------------


def test_slack_users_are_linked_moved_listed_and_unlinked_by_the_command(db):
    UserFactory(username="dana")
    UserFactory(username="erin")
    out = StringIO()
    call_command("slack_users", "link", "dana", "U0DANA", stdout=out)
    call_command("slack_users", "link", "dana", "U0DANA", stdout=out)
    call_command("slack_users", "link", "erin", "U0DANA", stdout=out)
    call_command("slack_users", "list", stdout=out)
    assert out.getvalue().splitlines() == [
        "linked: U0DANA -> dana",
        "already linked: U0DANA -> dana",
        "linked: U0DANA -> erin",
        "U0DANA\terin",
    ]
    for bad in (["link", "nobody", "U0X1"], ["link", "dana", "not-an-id"], ["unlink", "U0NONE"]):
        with pytest.raises(CommandError):
            call_command("slack_users", *bad, stdout=out)
    call_command("slack_users", "unlink", "U0DANA", stdout=out)
    assert not SlackUser.objects.exists()


def test_the_admin_keeps_the_links(admin_client):
    user = UserFactory(username="frank")
    response = admin_client.post(
        reverse("admin:agentruns_slackuser_add"), {"slack_user_id": "U0FRANK", "user": user.pk}
    )
    assert response.status_code == 302
    assert SlackUser.objects.get(slack_user_id="U0FRANK").user == user
    listing = admin_client.get(reverse("admin:agentruns_slackuser_changelist"))
    assert "U0FRANK" in listing.content.decode()


# --- Set-up checks -----------------------------------------------------------------------------


def test_manage_py_check_says_when_slack_is_set_up_but_cannot_work(monkeypatch):
    from django.core.checks import run_checks

    def ids() -> set[str]:
        return {m.id for m in run_checks() if m.id.startswith("agentruns.")}

    monkeypatch.delenv("LEASEHOLD_SLACK_SIGNING_SECRET", raising=False)
    assert not ids() & {"agentruns.E020", "agentruns.W020"}
    monkeypatch.setenv("LEASEHOLD_SLACK_SIGNING_SECRET", SECRET)
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": ""}):
        assert "agentruns.W020" in ids()
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE}):
        assert not ids() & {"agentruns.E020", "agentruns.W020"}
    refusing = {"SITE_URL": SITE, "SECRET_ENV_PREFIXES": ["ACME_"]}
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, **refusing}):
        assert "agentruns.E020" in ids()
