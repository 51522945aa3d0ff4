"""What the dashboard's charts show, read with one aggregate query each over a bounded window.

Every function takes a ``Window`` and answers a ``ChartData`` (x labels and named series of
numbers, ``None`` where there is nothing to show). The number of queries is constant whatever the
history's size: each function runs exactly one, over the window only (served by an index:
``agentrun_status_finished`` for terminal runs, the partial indexes of migration 0016 for
``approval``, ``input`` and ``reaper`` events, the spend ledger's ``(scope, key, day)`` index
for the cost, ``agentrun_status_lease``/``agentrun_status_created`` for the waiting runs by
status).

Hours and days are those of the current time zone (``DJANGO_TIME_ZONE``, UTC by default, or the
user's own, ``agentruns.middleware``); windows end at the app server's clock, except the ages of
the runs waiting now, which are measured on the database clock like ``/metrics``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.db.models import Case, CharField, Count, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Concat, Now, TruncDate, TruncHour
from django.utils import timezone

from agentruns import budgets
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    SpendDay,
    SpendScope,
    Status,
)
from agentruns.turns import DEADLINE

HOURS = 24
DAYS = 14
FINAL_STATUSES = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
WAITING_KINDS = (
    (Status.WAITING_FOR_APPROVAL, "approval"),
    (Status.WAITING_FOR_INPUT, "input"),
    (Status.WAITING_FOR_RECONCILIATION, "reconciliation"),
)
# Upper bounds of the waiting-age buckets (the last one is open).
AGE_BUCKETS = (
    ("under 5 min", timedelta(minutes=5)),
    ("5 min – 1 h", timedelta(hours=1)),
    ("1 h – 1 day", timedelta(days=1)),
    ("over 1 day", None),
)


@dataclass(frozen=True)
class Series:
    name: str
    values: list[float | None]


@dataclass(frozen=True)
class ChartData:
    """One chart's numbers: a value per x label in each series; ``unit`` names the y axis."""

    x_labels: list[str]
    series: list[Series]
    unit: str
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not any(v for s in self.series for v in s.values)


@dataclass(frozen=True)
class Window:
    """The moment the dashboard is drawn for (aware) and its spans: the last ``hours`` hours,
    the last ``days`` days (today included)."""

    now: datetime
    hours: int = HOURS
    days: int = DAYS

    @classmethod
    def ending_now(cls) -> Window:
        return cls(now=timezone.now())

    def hour_starts(self) -> list[datetime]:
        """The starts of the last ``hours`` hours of the current time zone, oldest first (a
        local hour is an hour of absolute time, so stepping in UTC keeps the boundaries)."""
        local = timezone.localtime(self.now).replace(minute=0, second=0, microsecond=0)
        last = local.astimezone(UTC)
        return [last - timedelta(hours=n) for n in reversed(range(self.hours))]

    def days_list(self) -> list[date]:
        today = timezone.localdate(self.now)
        return [today - timedelta(days=n) for n in reversed(range(self.days))]

    def first_day_start(self) -> datetime:
        """The first instant of the window's first day in the current time zone."""
        first = self.days_list()[0]
        return timezone.make_aware(datetime.combine(first, datetime.min.time()))


def _hour_label(start: datetime) -> str:
    return timezone.localtime(start).strftime("%H:00")


def _day_label(day: date) -> str:
    return day.strftime("%b %d")


def runs_per_hour(window: Window) -> ChartData:
    """Runs that ended in each of the last 24 hours, by final status (one ``GROUP BY`` over
    ``agentrun_status_finished``)."""
    starts = window.hour_starts()
    rows = (
        AgentRun.objects.filter(status__in=FINAL_STATUSES, finished_at__gte=starts[0])
        .annotate(hour=TruncHour("finished_at"))
        .values("hour", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts: dict[tuple[datetime, str], int] = {}
    for row in rows:
        counts[(row["hour"], row["status"])] = row["n"]
    return ChartData(
        x_labels=[_hour_label(s) for s in starts],
        series=[
            Series(str(status), [float(counts.get((s, status), 0)) for s in starts])
            for status in FINAL_STATUSES
        ],
        unit="runs",
    )


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0–1) of ``ordered`` (sorted, not empty), interpolated linearly
    between the closest ranks — what PostgreSQL's ``percentile_cont`` answers."""
    if not ordered:
        raise ValueError("no values")
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def approval_waits(window: Window) -> list[tuple[datetime, float]]:
    """``(decided_at, seconds waited)`` for every approval decision in the window, in one query.

    A run starts waiting for approval when its segment suspends it; that write records no event
    of its own, but it is the segment's last step: the wait is the time from the run's event
    before the ``approval`` event (the model's answer proposing the calls, or the verification
    that sent the turn back) to the ``approval`` event, approved or denied. Read through the
    partial index on ``approval`` events and the ``(run, sequence)`` unique index."""
    previous = (
        AgentRunEvent.objects.filter(run_id=OuterRef("run_id"), sequence=OuterRef("sequence") - 1)
        .order_by()  # not the model's ordering: it would join the runs to sort one row
        .values("created_at")[:1]
    )
    rows = (
        AgentRunEvent.objects.filter(
            kind=EventKind.APPROVAL, created_at__gte=window.first_day_start()
        )
        .annotate(asked_at=Subquery(previous))
        .values_list("created_at", "asked_at")
        .order_by()
    )
    return [
        (decided, max(0.0, (decided - asked).total_seconds()))
        for decided, asked in rows
        if asked is not None
    ]


def approval_wait_per_day(window: Window) -> ChartData:
    """Median and 95th percentile of the approval waits decided on each of the last 14 days
    (``approval_waits``: one query; the percentiles are computed here, the same way on SQLite,
    which has no ``percentile_cont``, and PostgreSQL)."""
    days = window.days_list()
    per_day: dict[date, list[float]] = defaultdict(list)
    for decided, seconds in approval_waits(window):
        per_day[timezone.localdate(decided)].append(seconds)
    medians: list[float | None] = []
    p95s: list[float | None] = []
    counts: list[int] = []
    for day in days:
        waits = sorted(per_day.get(day, []))
        counts.append(len(waits))
        medians.append(percentile(waits, 0.5) / 60 if waits else None)
        p95s.append(percentile(waits, 0.95) / 60 if waits else None)
    return ChartData(
        x_labels=[_day_label(d) for d in days],
        series=[Series("median", medians), Series("95th percentile", p95s)],
        unit="minutes",
        notes=[f"{sum(counts)} decision(s) in {window.days} days"],
    )


#: How a settle by the approval deadline (§5.11) is named beside the reaper's verdicts.
DEADLINE_VERDICTS = {"deny": "deadline: denied", "fail": "deadline: failed"}


def reaper_verdicts_per_day(window: Window) -> ChartData:
    """The reaper pass's verdicts on each of the last 14 days: its ``reaper`` events by verdict,
    and the approval deadlines it settled (the ``approval`` and ``input`` events by the
    deadline, by action). One ``GROUP BY`` over the window; each branch of its condition is
    served by its partial index (``reaper``, ``approval``, ``input`` events)."""
    days = window.days_list()
    by_deadline = Q(payload__by=DEADLINE)
    rows = (
        AgentRunEvent.objects.filter(
            Q(kind=EventKind.REAPER)
            | Q(kind=EventKind.APPROVAL) & by_deadline
            | Q(kind=EventKind.INPUT) & by_deadline,
            created_at__gte=window.first_day_start(),
        )
        .annotate(
            day=TruncDate("created_at"),
            verdict=Case(
                When(kind=EventKind.REAPER, then=KT("payload__verdict")),
                default=Concat(Value("deadline:"), KT("payload__action")),
                output_field=CharField(),
            ),
        )
        .values("day", "verdict")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts: dict[tuple[date, str], int] = {}
    for row in rows:
        verdict = str(row["verdict"] or "unknown")
        if verdict.startswith("deadline:"):
            action = verdict.removeprefix("deadline:")
            verdict = DEADLINE_VERDICTS.get(action, f"deadline: {action or 'unknown'}")
        key = (row["day"], verdict)
        counts[key] = counts.get(key, 0) + row["n"]
    verdicts = sorted({verdict for _, verdict in counts})
    return ChartData(
        x_labels=[_day_label(d) for d in days],
        series=[
            Series(verdict, [float(counts.get((d, verdict), 0)) for d in days])
            for verdict in verdicts
        ],
        unit="verdicts",
    )


#: The cost chart names this many configurations (the most expensive over the window); the rest
#: are summed as one series, so a fleet of configurations still draws a legible chart.
COST_SERIES = 8


def cost_per_configuration_per_day(window: Window) -> ChartData:
    """What each configuration's model calls cost on each of the last 14 days, from the spend
    ledger (``SpendDay``, the rows the daily budgets are checked against; docs/design.md §14),
    never from the events: one ``GROUP BY`` over the ledger's ``(scope, key, day)`` index, the
    configuration's name read in the same query.

    The ledger's days are UTC days by the database clock (a budget's day), whatever the page's
    time zone; a call in flight counts what its reservation holds until its answer is charged.
    """
    today = window.now.astimezone(UTC).date()
    days = [today - timedelta(days=n) for n in reversed(range(window.days))]
    name = AgentConfiguration.objects.filter(pk=OuterRef("key")).values("name")[:1]
    rows = (
        SpendDay.objects.filter(scope=SpendScope.CONFIGURATION, day__gte=days[0])
        .values("key", "day")
        .annotate(total=Sum("amount"), name=Subquery(name))
        .order_by()
    )
    amounts: dict[tuple[int, date], float] = {}
    names: dict[int, str] = {}
    for row in rows:
        amounts[(row["key"], row["day"])] = float(row["total"] or 0)
        names[row["key"]] = row["name"] or f"deleted configuration #{row['key']}"
    by_total = sorted(names, key=lambda key: -sum(v for (k, _), v in amounts.items() if k == key))
    shown, rest = by_total[:COST_SERIES], by_total[COST_SERIES:]
    series = [Series(names[key], [amounts.get((key, d), 0.0) for d in days]) for key in shown]
    if rest:
        series.append(
            Series(
                f"{len(rest)} other configuration(s)",
                [sum(amounts.get((key, d), 0.0) for key in rest) for d in days],
            )
        )
    return ChartData(
        x_labels=[_day_label(d) for d in days],
        series=series,
        unit=budgets.currency(),
        notes=["UTC days (the budgets' days)"],
    )


def _age_filter(low: timedelta | None, high: timedelta | None) -> Q:
    """Runs that have waited at least ``low`` and less than ``high`` (database clock; a run
    waits since its last state change, ``updated_at``)."""
    condition = Q()
    if high is not None:
        condition &= Q(updated_at__gt=Now() - high)
    if low is not None:
        condition &= Q(updated_at__lte=Now() - low)
    return condition


def _buckets() -> Iterable[tuple[str, timedelta | None, timedelta | None]]:
    low: timedelta | None = None
    for label, high in AGE_BUCKETS:
        yield label, low, high
        low = high


def waiting_now_by_age(window: Window) -> ChartData:
    """Runs waiting for a person now, per kind, by how long they have waited: one ``GROUP BY``
    status with a filtered count per age bucket."""
    buckets = list(_buckets())
    aggregates = {
        f"b{n}": Count("id", filter=_age_filter(low, high))
        for n, (_, low, high) in enumerate(buckets)
    }
    rows = (
        AgentRun.objects.filter(status__in=[status for status, _ in WAITING_KINDS])
        .values("status")
        .annotate(**aggregates)
        .order_by()
    )
    by_status = {row["status"]: row for row in rows}
    return ChartData(
        x_labels=[label for label, _, _ in buckets],
        series=[
            Series(
                kind,
                [float(by_status.get(status, {}).get(f"b{n}", 0)) for n in range(len(buckets))],
            )
            for status, kind in WAITING_KINDS
        ],
        unit="runs",
    )
