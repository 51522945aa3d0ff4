"""The dashboard's charts, in the order the page shows them.

Each chart is one small function, query → series (``agentruns.dashboard.series``), drawn as SVG
(``agentruns.dashboard.svg``); ``CHARTS`` lists them. Adding one is a ``Chart`` in the list: its
function must run a constant number of queries (one, so far) over a bounded window.

Cost per configuration per day reads the spend ledger (``SpendDay``), not the runs: a run that
spans midnight is charged on the day of each call. A configuration's name is user-chosen text:
it is only ever a series name, which the SVG and the table escape
(``tests/agentruns/dashboard/test_pages.py`` draws a hostile one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.utils.safestring import SafeString

from agentruns.dashboard import rule_series, series, svg
from agentruns.dashboard.series import ChartData, Window


@dataclass(frozen=True)
class Chart:
    slug: str
    title: str
    description: str
    kind: str  # "stacked", "bar" or "line" (agentruns.dashboard.svg.KINDS)
    build: Callable[[Window], ChartData]


@dataclass(frozen=True)
class DrawnChart:
    chart: Chart
    data: ChartData
    svg: SafeString

    @property
    def rows(self) -> list[tuple[str, list[float | None]]]:
        """The numbers as table rows: an x label and its value in each series."""
        return [
            (label, [s.values[i] for s in self.data.series])
            for i, label in enumerate(self.data.x_labels)
        ]


RUNS_PER_HOUR = Chart(
    slug="runs-per-hour",
    title="Runs ended per hour, last 24 hours",
    description="Runs that reached a final status in each hour, stacked by that status.",
    kind="stacked",
    build=series.runs_per_hour,
)
APPROVAL_WAIT = Chart(
    slug="approval-wait",
    title="Approval wait per day, last 14 days",
    description=(
        "How long a turn waited for its approval decision (approved or denied), from the "
        "step that asked to the decision: the median and the 95th percentile of the decisions "
        "made that day, in minutes."
    ),
    kind="bar",
    build=series.approval_wait_per_day,
)
REAPER_VERDICTS = Chart(
    slug="reaper-verdicts",
    title="Reaper verdicts per day, last 14 days",
    description=(
        "The reaper's verdicts on stale runs and its redispatches, and the approval deadlines "
        "it settled (denied or failed), by verdict."
    ),
    kind="stacked",
    build=series.reaper_verdicts_per_day,
)
COST_PER_CONFIGURATION = Chart(
    slug="cost-per-configuration",
    title="Cost per configuration per day, last 14 days",
    description=(
        "What each configuration's model calls cost on each UTC day, stacked, in the "
        "configured currency (the eight most expensive by name, the others summed)."
    ),
    kind="stacked",
    build=series.cost_per_configuration_per_day,
)
WAITING_NOW = Chart(
    slug="waiting-now",
    title="Runs waiting now, by how long",
    description=(
        "Runs waiting for a person right now, per kind of wait, by the time since they "
        "started waiting."
    ),
    kind="bar",
    build=series.waiting_now_by_age,
)

AUTO_APPROVALS = Chart(
    slug="auto-approvals",
    title="Auto-approvals per standing approval, last 14 days",
    description=(
        "The turns each standing approval approved without a person waiting, and the calls "
        "they held (the ten rules that approved most)."
    ),
    kind="bar",
    build=rule_series.auto_approvals_per_rule,
)

CHARTS: list[Chart] = [
    RUNS_PER_HOUR,
    APPROVAL_WAIT,
    REAPER_VERDICTS,
    COST_PER_CONFIGURATION,
    WAITING_NOW,
    AUTO_APPROVALS,
]


def draw(chart: Chart, window: Window) -> DrawnChart:
    data = chart.build(window)
    return DrawnChart(chart, data, svg.render(data, kind=chart.kind, label=chart.title))


def draw_all(window: Window | None = None) -> list[DrawnChart]:
    """Every chart of ``CHARTS`` for ``window`` (default: ending now): one query each."""
    window = window or Window.ending_now()
    return [draw(chart, window) for chart in CHARTS]
