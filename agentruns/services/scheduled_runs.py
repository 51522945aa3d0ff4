"""Scheduled runs: start the runs of the ``RunSchedule`` rows that are due
(docs/schedules_and_events.md).

``schedules_start_due`` is the task django-q2's scheduler runs every minute
(``setup_schedules``). Each due schedule is taken in one transaction: a guarded ``UPDATE`` moves
its ``next_run_at`` on (``WHERE next_run_at`` = the value read: of two workers looking at one
tick, one moves it and the other matches no row), then a ``ScheduledStart`` row is inserted
under its unique (schedule, due time) constraint, then the run is enqueued through
``runs.run_enqueue`` — so a tick delivered twice, by two workers or a retried task, starts one
run. Ticks missed while no worker ran start one run, for the latest due time.

The initiator's ``agentruns.start_agentrun`` is read afresh at each start; a start it may not
make (or of a deactivated configuration, or a prompt the request rules refuse) is recorded as
skipped and logged, and the schedule moves on. Never starts a run synchronously.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from agentruns import schedule_times
from agentruns.authority import start_authority
from agentruns.exceptions import LeaseholdError
from agentruns.models import RunSchedule, ScheduledStart, StartOutcome
from agentruns.services import runs

logger = logging.getLogger(__name__)


@dataclass
class TickResult:
    """What one pass did: how many schedules it started, skipped, first timed, or found taken."""

    started: int = 0
    skipped: int = 0
    timed: int = 0
    taken: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.started} scheduled runs started, {self.skipped} skipped, {self.timed} "
            f"schedules timed, {self.taken} taken by another worker"
        )


def due_schedules(now: datetime) -> list[RunSchedule]:
    """Enabled schedules whose ``next_run_at`` has come or was never worked out."""
    return list(
        RunSchedule.objects.filter(enabled=True)
        .filter(Q(next_run_at__lte=now) | Q(next_run_at__isnull=True))
        .select_related("configuration")
        .order_by("next_run_at", "pk")
    )


def schedules_start_due(*, now: datetime | None = None) -> TickResult:
    """Start a run for every due schedule (at most one per schedule per pass)."""
    now = now or timezone.now()
    result = TickResult()
    for schedule in due_schedules(now):
        outcome = schedule_tick(schedule=schedule, now=now)
        setattr(result, outcome, getattr(result, outcome) + 1)
    return result


def schedule_tick(*, schedule: RunSchedule, now: datetime) -> str:
    """Take ``schedule``'s latest due time at or before ``now`` and start its run once.

    Returns ``"timed"`` (its first due time was worked out; nothing started), ``"skipped"``
    (its timing does not parse: logged, nothing recorded, the other schedules go on), ``"taken"``
    (another pass moved it on first, or its start was recorded already), ``"skipped"`` or
    ``"started"``. A schedule that is not due returns ``"taken"`` too: nothing of it was ours.
    """
    timing = schedule.timing()
    problem = schedule_times.timing_problem(**timing)
    if problem is not None:  # a row written around its validation (agentruns.E061)
        logger.error("schedule %r (%s) cannot be followed: %s", schedule.name, schedule.pk, problem)
        return "skipped"
    if schedule.next_run_at is None:
        first = schedule_times.first_due(after=now, **timing)
        return "timed" if _advance(schedule, expected=None, to=first) else "taken"
    due = schedule_times.latest_due(next_due=schedule.next_run_at, now=now, **timing)
    if due is None:
        return "taken"
    following = schedule_times.first_due(after=due, **timing)
    with transaction.atomic():
        if not _advance(schedule, expected=schedule.next_run_at, to=following):
            return "taken"
        try:
            with transaction.atomic():
                start = ScheduledStart.objects.create(
                    schedule=schedule, scheduled_for=due, outcome=StartOutcome.SKIPPED
                )
        except IntegrityError:  # this due time was started already (the unique constraint)
            return "taken"
        return _start(schedule, start)


def _advance(schedule: RunSchedule, *, expected: datetime | None, to: datetime) -> bool:
    """Move ``next_run_at`` from ``expected`` to ``to``; False: another pass moved it first."""
    guard = Q(next_run_at__isnull=True) if expected is None else Q(next_run_at=expected)
    return RunSchedule.objects.filter(guard, pk=schedule.pk).update(next_run_at=to) == 1


def _start(schedule: RunSchedule, start: ScheduledStart) -> str:
    """Enqueue the run ``start`` records, or record why not."""
    refusal = start_refusal(schedule)
    run = None
    if refusal is None:
        try:
            run = runs.run_enqueue(
                configuration=schedule.configuration,
                prompt=schedule.prompt,
                initiator=get_user_model().objects.get(pk=schedule.initiator_id),
            )
        except LeaseholdError as exc:
            refusal = exc.message
    if run is None:
        logger.warning("schedule %r (%s) skipped: %s", schedule.name, schedule.pk, refusal)
        start.note = (refusal or "")[:500]
        start.save(update_fields=["note"])
        return "skipped"
    start.outcome = StartOutcome.STARTED
    start.run_uuid = run.uuid
    start.save(update_fields=["outcome", "run_uuid"])
    return "started"


def start_refusal(schedule: RunSchedule) -> str | None:
    """Why ``schedule`` may not start a run now (its initiator read afresh), or None."""
    initiator = get_user_model().objects.filter(pk=schedule.initiator_id).first()
    if initiator is None or not initiator.is_active:
        return "its initiator's account is gone or inactive"
    authority = start_authority(initiator)
    if not authority.allowed:
        return f"its initiator {initiator.get_username()} may not: {authority.refusal}"
    if not schedule.configuration.is_active:
        return f"configuration {schedule.configuration.slug!r} is not active"
    return None


def schedule_retime(*, schedule: RunSchedule) -> None:
    """Forget ``schedule``'s pending due time (its timing changed): the next pass works out the
    first due time after it from the new timing."""
    RunSchedule.objects.filter(pk=schedule.pk).update(next_run_at=None)
    schedule.next_run_at = None
