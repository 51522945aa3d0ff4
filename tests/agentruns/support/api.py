"""Helpers for the API tests: scripted configurations and runs parked in each waiting state."""

from __future__ import annotations

from typing import Any

from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    Effect,
    Status,
)
from agentruns.services import runs
from agentruns.tools.shown import shown_turn
from agentruns.turns import PendingTurn, read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory

NOTE_CALL = {"name": "create_note", "arguments": {"title": "t", "body": "b"}}
APPROVAL_SCRIPT = [{"tool_calls": [NOTE_CALL]}, {"content": "created"}]
# call_webhook declares approve_permission playground.approve_webhooks (docs/design.md §5.6).
WEBHOOK_CALL = {
    "name": "call_webhook",
    "arguments": {"url": "http://hooks.invalid/", "payload": {}},
}
WEBHOOK_SCRIPT = [{"tool_calls": [WEBHOOK_CALL]}, {"content": "sent"}]
INPUT_SCRIPT = [
    {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
    {"content": "thanks"},
]


def config(slug: str, script: list[dict[str, Any]], **extra: Any) -> AgentConfiguration:
    return AgentConfigurationFactory(slug=slug, script=script, **extra)


def waiting_for_approval(
    user: Any = None, *, script: list[dict[str, Any]] = APPROVAL_SCRIPT, **extra: Any
) -> AgentRun:
    configuration = config(extra.pop("slug", "notes"), script, **extra)
    result = runs.run_start_sync(configuration=configuration, prompt="make a note", initiator=user)
    assert result.run.status == Status.WAITING_FOR_APPROVAL, result
    return result.run


def waiting_for_input(user: Any = None) -> AgentRun:
    result = runs.run_start_sync(
        configuration=config("asker", INPUT_SCRIPT), prompt="ask me", initiator=user
    )
    assert result.run.status == Status.WAITING_FOR_INPUT, result
    return result.run


def in_doubt(user: Any = None, *, call: dict[str, Any] | None = None, **extra: Any) -> AgentRun:
    """A run parked as the reaper parks one caught mid non-idempotent write (without the
    history before it: its script's first turn is the answer after the verdict). ``call``
    (``{name, arguments}``, default ``create_note``) is the write in doubt; ``extra`` goes to
    its configuration."""
    run = AgentRun.objects.create(
        configuration=config(extra.pop("slug", "doubt"), [{"content": "resumed"}], **extra),
        initiator=user,
        prompt="make a note",
        status=Status.WAITING_FOR_RECONCILIATION,
        lease_epoch=1,
        pending_effect=Effect.NON_IDEMPOTENT_WRITE,
        pending_call={"id": "call_0_0", **(call or NOTE_CALL), "effect": "non_idempotent_write"},
    )
    AgentRun.objects.filter(pk=run.pk).update(
        pending_turn=PendingTurn.for_reconciliation(run).to_json()
    )
    run.refresh_from_db()
    return run


def digest(run: AgentRun) -> str:
    """The digest the run's card sends now (``card_digest``)."""
    run.refresh_from_db()
    return card_digest(run)


def card_digest(run: AgentRun) -> str:
    """The digest the run's card shows (and sends) now: its stored turn shown by the run's gate
    (``agentruns.tools.shown``)."""
    run = AgentRun.objects.select_related("configuration").get(pk=run.pk)
    return shown_turn(run, read_pending_turn(run)).turn_digest


DECIDE = "agentruns.decide_agentrun"


def client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body
