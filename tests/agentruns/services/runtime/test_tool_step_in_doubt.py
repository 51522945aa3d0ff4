"""A write whose outcome is unknown is in doubt, never a failure to retry (issue 11 §2,
docs/design.md §9.1): a webhook that received the POST but answered after the tool timeout parks
the run in ``waiting_for_reconciliation`` — the model is not told it failed, nothing is sent
again — and a person's verdict continues it."""

from __future__ import annotations

import socket

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import events

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
WEBHOOKS = "playground.approve_webhooks"


def webhook_run(url: str) -> AgentRun:
    call = {"name": "call_webhook", "arguments": {"url": url, "payload": {"n": 1}}}
    configuration = AgentConfigurationFactory(script=[{"tool_calls": [call]}, {"content": "sent"}])
    result = runs.run_start_sync(configuration=configuration, prompt="notify")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def test_a_webhook_that_answers_too_late_parks_the_run_in_doubt(holding_server, client):
    decider = UserFactory(permissions=[DECIDE, WEBHOOKS])
    agentruns = {
        **settings.AGENTRUNS,
        "WEBHOOK_ALLOWLIST": [holding_server.netloc],
        "TOOL_TIMEOUT_SECONDS": 1,
    }
    with override_settings(AGENTRUNS=agentruns):
        run = webhook_run(holding_server.url())
        result = runs.run_decide(
            run_uuid=run.uuid,
            actor=decider,
            approved=True,
            turn_digest=card_digest(run),
            mode="inline",
        )

    assert result.outcome == Outcome.AWAITING_RECONCILIATION
    assert len(holding_server.requests) == 1  # it was sent, once
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_effect == "non_idempotent_write"  # the fence stays for the reconciler
    assert (run.claimed_by, run.lease_expires) == ("", None)
    card = read_pending_turn(run)
    assert card.kind == "reconciliation" and card.call.name == "call_webhook"
    assert "no answer came" in card.reason and "TimeoutError" in card.reason
    assert card.idempotency_key == f"{run.uuid}:{card.call.id}"
    assert holding_server.requests[0].headers["Idempotency-Key"] == card.idempotency_key
    # The model was told nothing yet: no tool event, an in_doubt event with the error.
    assert not [e for e in events(run) if e.kind == EventKind.TOOL]
    (doubt,) = [e for e in events(run) if e.kind == EventKind.IN_DOUBT]
    assert doubt.payload["call_id"] == card.call.id and "TimeoutError" in doubt.payload["error"]

    staff = UserFactory(username="reviewer", is_staff=True, permissions=[DECIDE, WEBHOOKS])
    client.force_login(staff)
    html = client.get("/admin/approvals/").content.decode()
    assert "timed out or lost its connection after it was sent" in html

    # A person says it landed: the run continues without sending it again.
    holding_server.release()
    done = runs.run_reconcile(
        run_uuid=run.uuid,
        actor=decider,
        verdict="landed",
        turn_digest=card_digest(run),
        mode="inline",
    )
    assert done.outcome == Outcome.COMPLETED
    assert len(holding_server.requests) == 1
    (tool,) = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert tool.payload["outcome"] == "reconciled_landed"


def test_a_refused_connection_is_a_failure_the_model_sees():
    """Nothing was sent: a definite answer, reported to the model as today."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again at once: nobody listens there
    decider = UserFactory(permissions=[DECIDE, WEBHOOKS])
    with override_settings(
        AGENTRUNS={**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [f"127.0.0.1:{port}"]}
    ):
        run = webhook_run(f"http://127.0.0.1:{port}/hook")
        result = runs.run_decide(
            run_uuid=run.uuid,
            actor=decider,
            approved=True,
            turn_digest=card_digest(run),
            mode="inline",
        )

    assert result.outcome == Outcome.COMPLETED
    (tool,) = [e for e in events(result.run) if e.kind == EventKind.TOOL]
    assert tool.payload["ok"] is False and "nothing was sent" in tool.payload["error"]
