"""Retention: deleting terminal runs, with their events, some days after they finished.

Only ``completed``, ``failed`` and ``cancelled`` runs are ever deleted: a terminal status is
absorbing (no transition leaves it), so a run chosen for deletion cannot come back to life
between the choice and the ``DELETE``. Waiting, running, queued and in-doubt runs are never
touched, however old. Ages are measured on the database clock, like leases.

Batches keep memory and lock time bounded: each batch reads the next ``batch_size`` run ids in
primary-key order after the last batch's (a keyset, so the purge is linear), then deletes their
events and the runs in one short transaction, re-checking the status and age in the ``DELETE``
itself. Two purges at once are safe: the second to reach a batch deletes nothing there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, QuerySet, Value
from django.db.models.functions import Now

from agentruns.models import TERMINAL_STATUSES, AgentRun, AgentRunEvent

DEFAULT_BATCH_SIZE = 1000


@dataclass
class PurgeResult:
    """What a purge removed (or, dry, would remove)."""

    older_than_days: int
    runs: int = 0
    events: int = 0
    batches: int = 0
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"{verb} {self.runs} run(s) and {self.events} event(s) finished more than "
            f"{self.older_than_days} day(s) ago"
            + ("" if self.dry_run else f" in {self.batches} batch(es)")
        )


def purgeable_runs(older_than_days: int) -> QuerySet[AgentRun]:
    """Terminal runs that finished more than ``older_than_days`` days ago (database clock)."""
    if older_than_days < 0:
        raise ValueError("older_than_days must be 0 or more")
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(days=older_than_days)), output_field=DateTimeField()
    )
    # Every transition into a terminal status stamps ``finished_at``; a row without one (none
    # is written so) is kept rather than guessed at.
    return AgentRun.objects.filter(status__in=TERMINAL_STATUSES, finished_at__lt=cutoff)


def _delete(queryset: QuerySet) -> int:
    """``DELETE`` the rows of ``queryset`` in one statement, without the ORM's collector (no
    signals, no cascade: the caller deletes dependents first); the number of rows deleted."""
    return queryset._raw_delete(queryset.db)


def runs_purge(
    *,
    older_than_days: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    on_batch: Callable[[int, int], None] | None = None,
) -> PurgeResult:
    """Delete the runs ``purgeable_runs`` selects, with their events, ``batch_size`` at a time.
    ``on_batch(runs, events)`` is called after each batch commits. ``dry_run`` counts only."""
    if batch_size < 1:
        raise ValueError("batch_size must be 1 or more")
    result = PurgeResult(older_than_days=older_than_days, dry_run=dry_run)
    candidates = purgeable_runs(older_than_days)
    if dry_run:
        result.runs = candidates.count()
        result.events = AgentRunEvent.objects.filter(run__in=candidates.values("pk")).count()
        return result
    last = 0
    while True:
        # Keyset pagination on the primary key: each batch reads on from where the last one
        # stopped, so a purge is linear in what it deletes.
        ids = list(
            candidates.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            break
        last = ids[-1]
        with transaction.atomic():
            # The age and status are checked again by the DELETE: only what is still
            # purgeable goes (a terminal run stays terminal, so this only guards the clock).
            # Two plain DELETEs: the ORM's cascading delete would first read every run of the
            # batch into Python to collect what depends on it, and events are all there is.
            doomed = candidates.filter(pk__in=ids)
            events = _delete(AgentRunEvent.objects.filter(run__in=doomed.values("pk")))
            runs = _delete(doomed)
        result.runs += runs
        result.events += events
        result.batches += 1
        if on_batch is not None:
            on_batch(runs, events)
    return result
