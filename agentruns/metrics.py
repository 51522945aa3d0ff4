"""``/metrics``: what an operator watches, in the Prometheus text format.

Every value comes from a cheap query at scrape time or from a ``Counter`` row, never from a scan
of the events:

* ``leasehold_runs{status}``: runs per status (one ``GROUP BY`` over the status indexes);
* ``leasehold_oldest_waiting_seconds{kind}``: how long the oldest run waiting for an approval,
  an input or a reconciliation has waited (database clock; 0 when none waits);
* ``leasehold_runs_in_doubt``: runs waiting for reconciliation (a write that may have landed);
* ``leasehold_stale_runs``: running runs whose lease expired (the reaper has not settled them);
* ``leasehold_reaper_verdicts_total{rule,verdict}`` and ``leasehold_reaper_passes_total``:
  counted by every reaper pass that changed something (``record_reaper_pass``);
* ``leasehold_lease_renewals_total`` and ``leasehold_leases_lost_total``: the heartbeat's
  renewals, tallied in the process and written once when a segment ends (``record_segment_end``),
  and the segments that ended because their lease was lost;
* ``leasehold_notifications_sent_total{channel}`` and
  ``leasehold_notification_failures_total{channel}``: counted once per notification pass.
* ``leasehold_cost_total{configuration,currency}``: what each configuration's model calls cost,
  summed over the spend ledger's daily rows (``SpendDay``: one per configuration and UTC day).

Readable by a staff session that may see every run (``selectors.sees_every_run``: the
dashboard's rule, since both count every run), or by a scraper with ``Authorization: Bearer
<METRICS_TOKEN>`` (``AGENTRUNS_METRICS_TOKEN``; empty = no token accepted). Anything else: 401
without credentials, 403 with wrong ones or without the permission.
"""

from __future__ import annotations

import hmac
import logging
from collections import Counter as Tally
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connection, transaction
from django.db.models import Count, Min, Sum
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from agentruns import budgets, selectors
from agentruns.conf import app_settings
from agentruns.models import AgentConfiguration, AgentRun, Counter, SpendDay, SpendScope, Status

if TYPE_CHECKING:
    from agentruns.leases import Lease
    from agentruns.services.reaper import ReaperReport

logger = logging.getLogger(__name__)

WAITING_KINDS = {
    Status.WAITING_FOR_APPROVAL: "approval",
    Status.WAITING_FOR_INPUT: "input",
    Status.WAITING_FOR_RECONCILIATION: "reconciliation",
}
REAPER_VERDICTS = "reaper_verdicts"
REAPER_PASSES = "reaper_passes"
LEASE_RENEWALS = "lease_renewals"
LEASES_LOST = "leases_lost"
NOTIFICATIONS_SENT = "notifications_sent"
NOTIFICATION_FAILURES = "notification_failures"
# Counters without labels, shown as ``leasehold_<name>_total``.
_PLAIN_COUNTERS = {
    LEASE_RENEWALS: "Lease renewals by the heartbeat while a provider or tool call ran.",
    LEASES_LOST: "Segments that stopped because their lease was lost.",
}
# Counters by channel, shown as ``leasehold_<name>_total{channel}``.
_CHANNEL_COUNTERS = {
    NOTIFICATIONS_SENT: "Notification digests sent, per channel (email, webhook).",
    NOTIFICATION_FAILURES: "Notification digests that could not be sent, per channel.",
}


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))


def _parse_labels(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if "=" in pair)


def counter_add(name: str, n: int = 1, **labels: str) -> None:
    """Raise the counter ``name{labels}`` by ``n`` (created at 0 on first use)."""
    counters_add([(name, labels, n)])


def counters_add(increments: list[tuple[str, Mapping[str, str], int]]) -> None:
    """Raise several counters in one statement: an ``INSERT … ON CONFLICT DO UPDATE`` that adds
    to the stored value (PostgreSQL, and SQLite 3.24 or later), so concurrent writers lose
    nothing and the first use creates the row."""
    if not increments:
        return
    table = connection.ops.quote_name(Counter._meta.db_table)
    now = "STATEMENT_TIMESTAMP()" if connection.vendor == "postgresql" else "CURRENT_TIMESTAMP"
    rows = ", ".join(f"(%s, %s, %s, {now})" for _ in increments)
    params: list[str | int] = []
    for name, labels, n in increments:
        params += [name, _labels(labels), n]
    # In a savepoint: a caller's transaction survives a failed count on PostgreSQL.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, labels, value, updated_at) VALUES {rows} "
            f"ON CONFLICT (name, labels) DO UPDATE SET value = {table}.value + excluded.value, "
            f"updated_at = excluded.updated_at",
            params,
        )


def record_reaper_pass(report: ReaperReport) -> None:
    """Count a reaper pass's verdicts by rule, in one statement. A dry run changed nothing and
    counts nothing; a failure to count is logged and never fails the pass."""
    if report.dry_run:
        return
    tally = Tally((v.rule, v.verdict) for v in [*report.verdicts, *report.expired])
    increments: list[tuple[str, Mapping[str, str], int]] = [
        (REAPER_VERDICTS, {"rule": rule, "verdict": verdict}, n)
        for (rule, verdict), n in sorted(tally.items())
    ]
    increments.append((REAPER_PASSES, {}, 1))
    try:
        counters_add(increments)
    except Exception:  # the pass itself is done; only the count is lost
        logger.exception("could not count a reaper pass for /metrics")


def record_segment_end(*, lease: Lease | None, lease_lost: bool) -> None:
    """Write the heartbeat renewals of ``lease`` tallied in this process, and a lost lease, in one
    statement (none when there is nothing to count). Called once when a segment ends; never
    raises: a failed write is logged and the renewals are kept for the next segment's."""
    from agentruns.services.runtime import ticker

    renewals = ticker.take_renewals(lease)
    increments: list[tuple[str, Mapping[str, str], int]] = []
    if renewals:
        increments.append((LEASE_RENEWALS, {}, renewals))
    if lease_lost:
        increments.append((LEASES_LOST, {}, 1))
    if not increments:
        return
    try:
        counters_add(increments)
    except Exception:  # the segment is over either way; only the count waits
        ticker.give_back_renewals(renewals)
        logger.exception("could not count lease renewals for /metrics")


def _database_now() -> datetime:
    """The database clock, as precise as the ``Now()`` that stamps ``updated_at``."""
    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        # What Django's Now() compiles to: SQLite's CURRENT_TIMESTAMP has whole seconds, and
        # PostgreSQL's is the transaction's start.
        cursor.execute(
            "SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')"
            if sqlite
            else "SELECT STATEMENT_TIMESTAMP()"
        )
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite answers text, in UTC
        value = datetime.fromisoformat(value + "+00:00")
    return value


class LeaseholdCollector(Collector):
    """Reads the numbers at scrape time."""

    def collect(self) -> Iterator[Metric]:
        rows = AgentRun.objects.values("status").annotate(n=Count("id"), oldest=Min("updated_at"))
        by_status = {row["status"]: row for row in rows.order_by()}
        runs = GaugeMetricFamily("leasehold_runs", "Runs per status.", labels=["status"])
        for status in Status.values:
            runs.add_metric([status], by_status.get(status, {}).get("n", 0))
        yield runs

        now = _database_now()
        waiting = GaugeMetricFamily(
            "leasehold_oldest_waiting_seconds",
            "Seconds the oldest run waiting for a person has waited, per kind (0: none waits).",
            labels=["kind"],
        )
        for status, kind in WAITING_KINDS.items():
            oldest = by_status.get(status, {}).get("oldest")
            waiting.add_metric([kind], max(0.0, (now - oldest).total_seconds()) if oldest else 0)
        yield waiting

        yield GaugeMetricFamily(
            "leasehold_runs_in_doubt",
            "Runs waiting for reconciliation: a write that may have landed.",
            value=by_status.get(Status.WAITING_FOR_RECONCILIATION, {}).get("n", 0),
        )
        yield GaugeMetricFamily(
            "leasehold_stale_runs",
            "Running runs whose lease expired and that the reaper has not settled yet.",
            value=AgentRun.objects.filter(status=Status.RUNNING, lease_expires__lt=Now()).count(),
        )

        verdicts = CounterMetricFamily(
            "leasehold_reaper_verdicts",
            "Reaper verdicts by rule and verdict.",
            labels=["rule", "verdict"],
        )
        passes = 0
        for row in Counter.objects.filter(name__in=[REAPER_VERDICTS, REAPER_PASSES]):
            if row.name == REAPER_PASSES:
                passes += row.value
                continue
            labels = _parse_labels(row.labels)
            verdicts.add_metric([labels.get("rule", ""), labels.get("verdict", "")], row.value)
        yield verdicts
        yield CounterMetricFamily(
            "leasehold_reaper_passes", "Reaper passes that were not dry runs.", value=passes
        )
        values: dict[str, dict[str, int]] = {}
        for counter in Counter.objects.filter(name__in=[*_PLAIN_COUNTERS, *_CHANNEL_COUNTERS]):
            channel = _parse_labels(counter.labels).get("channel", "")
            values.setdefault(counter.name, {})[channel] = counter.value
        for name, help_text in _PLAIN_COUNTERS.items():
            yield CounterMetricFamily(
                f"leasehold_{name}", help_text, value=sum(values.get(name, {}).values())
            )
        for name, help_text in _CHANNEL_COUNTERS.items():
            family = CounterMetricFamily(f"leasehold_{name}", help_text, labels=["channel"])
            for channel in ("email", "webhook"):
                family.add_metric([channel], values.get(name, {}).get(channel, 0))
            yield family
        yield _cost()


def _cost() -> CounterMetricFamily:
    """``leasehold_cost_total{configuration,currency}`` from the spend ledger: one ``GROUP BY``
    over the configurations' daily rows (never the events). A deleted configuration is named by
    its former id."""
    cost = CounterMetricFamily(
        "leasehold_cost",
        "What each configuration's model calls cost (AGENTRUNS_COST_CURRENCY).",
        labels=["configuration", "currency"],
    )
    totals = (
        SpendDay.objects.filter(scope=SpendScope.CONFIGURATION)
        .values("key")
        .annotate(total=Sum("amount"))
        .order_by("key")
    )
    rows = [(row["key"], row["total"]) for row in totals]
    slugs = dict(
        AgentConfiguration.objects.filter(pk__in=[key for key, _ in rows]).values_list("pk", "slug")
    )
    currency = budgets.currency()
    for key, total in rows:
        cost.add_metric([slugs.get(key, f"#{key}"), currency], float(total or 0))
    return cost


def _allowed(request: HttpRequest) -> int | None:
    """``None`` when ``request`` may read the metrics, else the status to refuse it with."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        expected = app_settings().metrics_token
        if (
            scheme.lower() == "bearer"
            and expected
            and hmac.compare_digest(token.strip().encode(), expected.encode())
        ):
            return None
        return 403
    user = request.user
    if not user.is_authenticated:
        return 401
    if not (user.is_active and user.is_staff and selectors.sees_every_run(user)):
        return 403
    return None


def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _allowed(request)
    if refused == 401:
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if refused is not None:
        return HttpResponse("not allowed\n", status=refused, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LeaseholdCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
