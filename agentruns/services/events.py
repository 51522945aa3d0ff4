"""Event-started runs: a signed event starts a run of a configuration, or delivers the input a
run started by an earlier event waits for (docs/schedules_and_events.md).

``event_receive`` checks, in order: the configuration receives events (its ``EventSource`` is
enabled, its configuration active, its secret's variable set and allowed by the secret rule;
else ``EventSourceNotFound``), the signature and timestamp (``BadSignature``), then the body
(``agentruns.event_requests.parse``). Only then is anything written.

Idempotent per event id: the ``ReceivedEvent`` row (unique per configuration and id) is inserted
in the same transaction as the run it starts or the input it delivers, so of two deliveries of
one event, sequential or racing, one takes effect and the other answers with its run. A replay
whose body differs is ``EventIdReused``. Runs start queued, through ``runs.run_enqueue``, as the
source's ``actor`` (``agentruns.start_agentrun`` read afresh); input is delivered through
``runs.run_submit_input`` as the actor (``agentruns.decide_agentrun``), validated against the
waiting input's schema (``InvalidInput``, 422: the run keeps waiting, and the event id stays
unused so a corrected event may reuse it).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from agentruns import event_requests
from agentruns.authority import start_authority
from agentruns.event_requests import Event, signing_secret
from agentruns.exceptions import (
    CorrelationKeyTaken,
    CorrelationKeyUnknown,
    EventIdReused,
    EventSourceNotFound,
    LeaseholdError,
    NotPermitted,
    NotWaiting,
)
from agentruns.models import AgentRun, EventAction, EventSource, ReceivedEvent, Status
from agentruns.services import runs
from agentruns.services._common import User
from agentruns.tools.shown import shown_turn
from agentruns.turns import read_pending_turn


@dataclass(frozen=True)
class EventOutcome:
    """What an accepted event did: ``action`` (started / input) on the run ``run_uuid``;
    ``replayed``: an earlier delivery of the same event did it."""

    event_id: str
    action: str
    run_uuid: UUID
    replayed: bool


def event_source(*, slug: str) -> tuple[EventSource, str]:
    """The enabled source of the active configuration ``slug`` and its secret;
    ``EventSourceNotFound`` when there is none or its secret cannot be read (the endpoint is
    off: the same answer as for a slug that does not exist)."""
    source = (
        EventSource.objects.filter(
            configuration__slug=slug, configuration__is_active=True, enabled=True
        )
        .select_related("configuration")
        .first()
    )
    if source is None:
        raise EventSourceNotFound()
    secret = signing_secret(source)
    if secret is None:
        raise EventSourceNotFound()
    return source, secret


def event_receive(
    *,
    slug: str,
    body: bytes,
    timestamp: str | None,
    signed: str | None,
    now: float | None = None,
) -> EventOutcome:
    """Check and apply one event sent to ``/api/events/<slug>/`` (see the module docstring)."""
    source, secret = event_source(slug=slug)
    event_requests.verify(secret, body, timestamp=timestamp, signed=signed, now=now)
    event = event_requests.parse(body)
    earlier = _received(source, event)
    if earlier is not None:
        return earlier
    actor = get_user_model().objects.filter(pk=source.actor_id, is_active=True).first()
    if actor is None:
        raise NotPermitted("the account events act as is gone or inactive")
    if event.delivers_input:
        return _deliver(source, event, actor)
    return _start(source, event, actor)


def _received(source: EventSource, event: Event) -> EventOutcome | None:
    """The outcome of an earlier delivery of ``event``, or None when it is new."""
    row = ReceivedEvent.objects.filter(
        configuration_id=source.configuration_id, event_id=event.id
    ).first()
    if row is None:
        return None
    if row.body_sha256 != event.sha256:
        raise EventIdReused()
    return EventOutcome(row.event_id, row.action, row.run_uuid, replayed=True)


def _start(source: EventSource, event: Event, actor: User) -> EventOutcome:
    """Enqueue a run with the event's data in its prompt, recorded under the event id."""
    authority = start_authority(actor)
    if not authority.allowed:
        raise NotPermitted(f"the account events act as may not: {authority.refusal}")
    prompt = event_requests.as_prompt(source.prompt, event)
    try:
        with transaction.atomic():
            run = runs.run_enqueue(
                configuration=source.configuration, prompt=prompt, initiator=actor
            )
            _record(source, event, EventAction.STARTED, run.uuid)
    except IntegrityError:  # a racing delivery of this event, or the key is taken
        earlier = _received(source, event)
        if earlier is None:
            raise CorrelationKeyTaken() from None
        return earlier
    return EventOutcome(event.id, EventAction.STARTED, run.uuid, replayed=False)


def _deliver(source: EventSource, event: Event, actor: User) -> EventOutcome:
    """Deliver ``event.input`` to the run started with its correlation key, through the input
    service, recorded under the event id in the same transaction."""
    run = _correlated_run(source, event.correlation_key)
    if run.status != Status.WAITING_FOR_INPUT:
        raise NotWaiting()
    digest = shown_turn(run, read_pending_turn(run)).turn_digest
    try:
        with transaction.atomic():
            runs.run_submit_input(
                run_uuid=run.uuid, actor=actor, values=event.input, turn_digest=digest
            )
            _record(source, event, EventAction.INPUT, run.uuid)
    except (IntegrityError, LeaseholdError):
        # A racing delivery of this event took the run first: answer as it did.
        earlier = _received(source, event)
        if earlier is None:
            raise
        return earlier
    return EventOutcome(event.id, EventAction.INPUT, run.uuid, replayed=False)


def _correlated_run(source: EventSource, key: str) -> AgentRun:
    started = ReceivedEvent.objects.filter(
        configuration_id=source.configuration_id,
        action=EventAction.STARTED,
        correlation_key=key,
    ).first()
    run = (
        AgentRun.objects.filter(uuid=started.run_uuid).select_related("configuration").first()
        if started is not None
        else None
    )
    if run is None:
        raise CorrelationKeyUnknown()
    return run


def _record(source: EventSource, event: Event, action: str, run_uuid: UUID) -> None:
    ReceivedEvent.objects.create(
        configuration_id=source.configuration_id,
        event_id=event.id,
        body_sha256=event.sha256,
        action=action,
        correlation_key=event.correlation_key if action == EventAction.STARTED else "",
        run_uuid=run_uuid,
    )
