"""Schedules and event sources for the tests of scheduled and event-started runs, and a sender's
signing (what another system's code does: ``v1:{timestamp}:{body}`` under the secret)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime
from typing import Any

from agentruns.models import AgentConfiguration, EventSource, RunSchedule
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import INPUT_SCRIPT

START = "agentruns.start_agentrun"
DECIDE = "agentruns.decide_agentrun"
SECRET_ENV = "LEASEHOLD_TEST_EVENTS_SECRET"
SECRET = "s3cret-for-the-tests-only-0123456789"


def schedule(
    *,
    configuration: AgentConfiguration | None = None,
    next_run_at: datetime | None = None,
    permitted: bool = True,
    **fields: Any,
) -> RunSchedule:
    """An enabled interval schedule (an hour unless ``fields`` say otherwise) whose initiator may
    start runs (unless not ``permitted``)."""
    initiator = UserFactory(permissions=[START] if permitted else [])
    values: dict[str, Any] = {
        "name": "hourly",
        "kind": "interval",
        "interval_seconds": 3600,
        "prompt": "summarise the night",
        **fields,
    }
    return RunSchedule.objects.create(
        configuration=configuration or AgentConfigurationFactory(slug="nightly"),
        initiator=initiator,
        next_run_at=next_run_at,
        **values,
    )


def event_source(
    *, slug: str = "events", script: list[dict[str, Any]] | None = None, actor_permissions=None
) -> EventSource:
    """The configuration ``slug`` receiving events signed with ``SECRET`` (the variable must be
    set by the test: ``monkeypatch.setenv(SECRET_ENV, SECRET)``), acting as an account that may
    start runs and decide."""
    configuration = AgentConfigurationFactory(slug=slug, script=script or INPUT_SCRIPT)
    actor = UserFactory(
        username=f"{slug}-sender",
        permissions=[START, DECIDE] if actor_permissions is None else actor_permissions,
    )
    return EventSource.objects.create(
        configuration=configuration,
        secret_env=SECRET_ENV,
        actor=actor,
        prompt="Handle the event.",
    )


def signed(body: dict[str, Any] | bytes, *, secret: str = SECRET, at: float | None = None) -> dict:
    """The raw body and the headers a sender sends with it (as Django test client keywords)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    timestamp = str(int(time.time() if at is None else at))
    mac = hmac.new(secret.encode(), b"v1:" + timestamp.encode() + b":" + raw, hashlib.sha256)
    return {
        "data": raw,
        "content_type": "application/json",
        "HTTP_X_LEASEHOLD_TIMESTAMP": timestamp,
        "HTTP_X_LEASEHOLD_SIGNATURE": f"v1={mac.hexdigest()}",
    }


def receive_kwargs(body: dict[str, Any] | bytes, **options: Any) -> dict[str, Any]:
    """``signed`` as ``services.events.event_receive``'s keyword arguments."""
    request = signed(body, **options)
    return {
        "body": request["data"],
        "timestamp": request["HTTP_X_LEASEHOLD_TIMESTAMP"],
        "signed": request["HTTP_X_LEASEHOLD_SIGNATURE"],
    }
