"""Read-only queries over runs and events."""

from __future__ import annotations

from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from agentruns.exceptions import RunNotFound
from agentruns.models import AgentRun, AgentRunEvent


def run_get(*, run_uuid: UUID | str) -> AgentRun:
    try:
        return AgentRun.objects.select_related("configuration", "initiator").get(uuid=run_uuid)
    except (AgentRun.DoesNotExist, ValidationError, ValueError):
        raise RunNotFound() from None


def run_events(*, run: AgentRun, after: int = -1) -> QuerySet[AgentRunEvent]:
    return run.events.filter(sequence__gt=after).select_related("actor").order_by("sequence")
