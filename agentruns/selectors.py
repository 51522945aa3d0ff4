"""Read-only queries over runs and events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import DateTimeField, ExpressionWrapper, QuerySet, Value
from django.db.models.functions import Now

from agentruns.exceptions import RunNotFound
from agentruns.models import AgentRun, AgentRunEvent, Status


def run_get(*, run_uuid: UUID | str) -> AgentRun:
    try:
        return AgentRun.objects.select_related("configuration", "initiator").get(uuid=run_uuid)
    except (AgentRun.DoesNotExist, ValidationError, ValueError):
        raise RunNotFound() from None


def run_events(*, run: AgentRun, after: int = -1) -> QuerySet[AgentRunEvent]:
    return run.events.filter(sequence__gt=after).select_related("actor").order_by("sequence")


def stale_runs(*, after: tuple[Any, int] | None = None) -> QuerySet[AgentRun]:
    """Running runs whose lease expired on the database clock, oldest lease first (RUNS.md §7).

    Served by the ``(status, lease_expires)`` index. ``after`` is a keyset cursor
    ``(lease_expires, pk)``: only runs strictly after it in that order. The caller adds the
    limit and, to act on them, ``select_for_update(skip_locked=True, of=("self",))``.
    """
    queryset = AgentRun.objects.filter(status=Status.RUNNING, lease_expires__lt=Now())
    if after is not None:
        lease_expires, pk = after
        # A range on the index's second column, minus the ties already seen.
        queryset = queryset.filter(lease_expires__gte=lease_expires).exclude(
            lease_expires=lease_expires, pk__lte=pk
        )
    return queryset.select_related("configuration").order_by("lease_expires", "pk")


def unclaimed_queued_runs(*, older_than_seconds: float) -> QuerySet[AgentRun]:
    """Queued runs untouched for ``older_than_seconds`` (database clock): nobody claimed them.

    Served by the ``(status, created_at)`` index's leading column; ``updated_at`` is bumped by
    every transition (and by each redispatch), so a run is redispatched at most once per period.
    """
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=older_than_seconds)), output_field=DateTimeField()
    )
    return AgentRun.objects.filter(status=Status.QUEUED, updated_at__lt=cutoff).order_by(
        "updated_at", "pk"
    )


def run_list(
    *,
    status: str | None = None,
    configuration: str | None = None,
    initiator_id: int | None = None,
) -> QuerySet[AgentRun]:
    """Runs, newest first, optionally narrowed to a status, a configuration slug, an initiator."""
    queryset = AgentRun.objects.select_related("configuration", "initiator")
    if status:
        queryset = queryset.filter(status=status)
    if configuration:
        queryset = queryset.filter(configuration__slug=configuration)
    if initiator_id is not None:
        queryset = queryset.filter(initiator_id=initiator_id)
    return queryset.order_by("-created_at", "-pk")
