"""Read-only queries over runs and events."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db.models import Count, DateTimeField, ExpressionWrapper, QuerySet, Value
from django.db.models.functions import Now

from agentruns.attribution import Attribution, attribute_runs
from agentruns.exceptions import RunNotFound
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status


def run_get(*, run_uuid: UUID | str) -> AgentRun:
    try:
        return AgentRun.objects.select_related("configuration__approver_group", "initiator").get(
            uuid=run_uuid
        )
    except (AgentRun.DoesNotExist, ValidationError, ValueError):
        raise RunNotFound() from None


def run_events(*, run: AgentRun, after: int = -1) -> QuerySet[AgentRunEvent]:
    return run.events.filter(sequence__gt=after).select_related("actor").order_by("sequence")


def stale_runs(*, after: tuple[Any, int] | None = None) -> QuerySet[AgentRun]:
    """Running runs whose lease expired on the database clock, oldest lease first (docs/design.md
    §8.1).

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


# --- The approvals inbox -------------------------------------------------------------------------

INBOX_KINDS: dict[str, str] = {
    "approval": Status.WAITING_FOR_APPROVAL,
    "input": Status.WAITING_FOR_INPUT,
    "reconciliation": Status.WAITING_FOR_RECONCILIATION,
}


def inbox_runs(*, kind: str | None = None) -> QuerySet[AgentRun]:
    """Runs waiting for a human, oldest first; ``kind`` narrows to one of ``INBOX_KINDS``.

    Configuration (with its approver group) and initiator are joined, so rendering a page of
    cards costs no further query per card.
    """
    statuses = [INBOX_KINDS[kind]] if kind in INBOX_KINDS else list(INBOX_KINDS.values())
    return (
        AgentRun.objects.filter(status__in=statuses)
        .select_related("configuration__approver_group", "initiator")
        .order_by("created_at", "pk")
    )


def inbox_counts() -> dict[str, int]:
    """How many runs wait in each inbox kind (one query)."""
    rows = (
        AgentRun.objects.filter(status__in=list(INBOX_KINDS.values()))
        .values("status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    by_status = {row["status"]: row["n"] for row in rows}
    return {kind: by_status.get(status, 0) for kind, status in INBOX_KINDS.items()}


def recent_runs() -> QuerySet[AgentRun]:
    """Every run, newest first, with configuration and initiator joined."""
    return AgentRun.objects.select_related("configuration", "initiator").order_by(
        "-created_at", "-pk"
    )


def run_attributions(*, runs: Iterable[AgentRun]) -> dict[int, Attribution | None]:
    """Approval attribution (docs/design.md §5.6) per run id, for any number of runs in one query.

    Reads every approving ``approval`` event of the given runs and ranks them with
    ``agentruns.attribution``; a run without approvals maps to ``None``.
    """
    initiators = {run.pk: run.initiator_id for run in runs}
    if not initiators:
        return {}
    deciders: dict[int, list[int | None]] = defaultdict(list)
    approvals = AgentRunEvent.objects.filter(
        run_id__in=list(initiators), kind=EventKind.APPROVAL, payload__approved=True
    ).values_list("run_id", "actor_id")
    for run_id, actor_id in approvals:
        deciders[run_id].append(actor_id)
    return attribute_runs(initiators=initiators, deciders=deciders)
