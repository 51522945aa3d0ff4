"""The operations dashboard (issue 14 §6): who may open it, what each chart counts, that it costs
a constant number of queries whatever the history, and that user-chosen text stays text."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agentruns.dashboard import charts, series, svg
from agentruns.dashboard.series import ChartData, Series, Window, percentile
from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import reaper, runs
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory
from tests.agentruns.support.dashboard import event, finished, history
from tests.approvals.conftest import start_waiting_run

pytestmark = pytest.mark.django_db

URL = "/admin/agentruns/agentrun/dashboard/"
HOSTILE = "<script>alert(1)</script>"
# Reference instants: inside an hour, well away from its edges.
NOW = datetime(2026, 11, 30, 15, 40, tzinfo=UTC)


def login(**kwargs) -> Client:
    client = Client()
    client.force_login(UserFactory(**kwargs))
    return client


def values(data: ChartData, name: str) -> list:
    return next(s.values for s in data.series if s.name == name)


# --- who may open it --------------------------------------------------------------------------


def test_the_url_is_the_admins():
    assert reverse("admin:agentruns_dashboard") == URL


def test_anonymous_and_non_staff_are_sent_to_the_login():
    for client in (Client(), login(username="outsider", is_staff=False)):
        response = client.get(URL)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_permission_to_see_every_run_get_403():
    client = login(username="plain-staff", permissions=["agentruns.view_agentrun"])
    assert client.get(URL).status_code == 403


@pytest.mark.parametrize(
    "kwargs",
    [
        {"username": "viewer", "permissions": ["agentruns.view_all_agentruns"]},
        {"username": "reviewer", "permissions": ["agentruns.decide_agentrun"]},
        {"username": "root", "is_superuser": True},
    ],
)
def test_staff_who_see_every_run_get_the_charts(kwargs):
    response = login(**kwargs).get(URL)
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]  # admin_view: never cached
    html = response.content.decode()
    for chart in charts.CHARTS:
        assert f'id="chart-{chart.slug}"' in html and chart.title in html
    assert html.count('class="pygal-chart"') == len(charts.CHARTS)
    assert html.count("Nothing to show yet.") == len(charts.CHARTS)  # no history at all


def test_the_permission_is_checked_on_every_request():
    user = UserFactory(username="revoked", permissions=["agentruns.view_all_agentruns"])
    client = Client()
    client.force_login(user)
    assert client.get(URL).status_code == 200
    user.user_permissions.clear()
    assert client.get(URL).status_code == 403
    user.is_staff = False
    user.save(update_fields=["is_staff"])
    assert client.get(URL).status_code == 302


def test_the_admin_index_links_to_it_for_those_who_may_open_it():
    index = reverse("admin:index")
    assert (
        URL
        in login(username="v", permissions=["agentruns.view_all_agentruns"])
        .get(index)
        .content.decode()
    )
    assert (
        URL
        not in login(username="p", permissions=["agentruns.view_agentrun"])
        .get(index)
        .content.decode()
    )


# --- what the charts count ----------------------------------------------------------------------


def test_runs_per_hour_counts_final_runs_by_the_hour_they_ended():
    window = Window(now=NOW)
    finished(Status.COMPLETED, NOW - timedelta(minutes=10))  # 15:xx
    finished(Status.COMPLETED, NOW - timedelta(minutes=30))  # 15:xx
    finished(Status.FAILED, NOW - timedelta(hours=2))  # 13:xx
    finished(Status.CANCELLED, NOW - timedelta(hours=23))  # 16:xx yesterday: the first hour
    finished(Status.COMPLETED, NOW - timedelta(hours=25))  # outside the window
    AgentRunFactory(running=True)  # not final

    data = series.runs_per_hour(window)

    assert len(data.x_labels) == 24
    assert data.x_labels[0] == "16:00" and data.x_labels[-1] == "15:00"
    assert values(data, "completed")[-1] == 2 and sum(values(data, "completed")) == 2
    assert values(data, "failed")[-3] == 1 and sum(values(data, "failed")) == 1
    assert values(data, "cancelled")[0] == 1 and sum(values(data, "cancelled")) == 1


def test_hours_and_days_are_those_of_the_current_time_zone():
    # 23:30 in New York on the 29th is 04:30 UTC on the 30th.
    late = datetime(2026, 11, 30, 4, 30, tzinfo=UTC)
    run = AgentRunFactory()
    event(run, 0, EventKind.REAPER, late, rule="reclaim", verdict="requeued")
    finished(Status.COMPLETED, late)
    with timezone.override("America/New_York"):
        window = Window(now=datetime(2026, 11, 30, 12, 0, tzinfo=UTC))  # 07:00 in New York
        verdicts = series.reaper_verdicts_per_day(window)
        hours = series.runs_per_hour(window)
    assert verdicts.x_labels[-1] == "Nov 30"
    assert values(verdicts, "requeued")[-2:] == [1, 0]  # the 29th, local time
    assert hours.x_labels[-1] == "07:00"
    assert values(hours, "completed")[hours.x_labels.index("23:00")] == 1


def test_percentile_interpolates_like_percentile_cont():
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([float(n) for n in range(1, 101)], 0.95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        percentile([], 0.5)


@pytest.mark.postgres
def test_percentile_is_postgresqls_percentile_cont():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    sample = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY v), "
            "percentile_cont(0.95) WITHIN GROUP (ORDER BY v) FROM unnest(%s::float8[]) AS v",
            [sample],
        )
        median, p95 = cursor.fetchone()
    ordered = sorted(sample)
    assert percentile(ordered, 0.5) == pytest.approx(median)
    assert percentile(ordered, 0.95) == pytest.approx(p95)


def test_approval_wait_is_from_the_step_that_asked_to_the_decision():
    window = Window(now=NOW)
    today = NOW - timedelta(hours=3)
    for minutes in (2, 4, 6, 30):
        run = AgentRunFactory(completed=True)
        event(run, 0, EventKind.LLM, today)
        event(run, 1, EventKind.APPROVAL, today + timedelta(minutes=minutes), approved=True)
    denied = AgentRunFactory(cancelled=True)  # a denial is a decision too
    event(denied, 0, EventKind.LLM, today - timedelta(days=2))
    event(denied, 1, EventKind.APPROVAL, today - timedelta(days=2, minutes=-10), approved=False)
    old = AgentRunFactory(completed=True)  # decided before the window
    event(old, 0, EventKind.LLM, NOW - timedelta(days=20))
    event(old, 1, EventKind.APPROVAL, NOW - timedelta(days=20) + timedelta(hours=5))

    data = series.approval_wait_per_day(window)

    assert data.x_labels[-1] == "Nov 30" and len(data.x_labels) == 14
    assert values(data, "median")[-1] == pytest.approx(5.0)
    assert values(data, "95th percentile")[-1] == pytest.approx(30 - 0.15 * 24)
    assert values(data, "median")[-3] == pytest.approx(10.0)
    assert values(data, "median")[-2] is None
    assert data.notes == ["5 decision(s) in 14 days"]


def test_approval_wait_of_a_real_run_decided_in_the_inbox_way():
    decider = UserFactory(username="decider", permissions=["agentruns.decide_agentrun"])
    run = start_waiting_run()
    # The run waited ten minutes: move its events back in time (the decision is written now).
    AgentRunEvent.objects.filter(run=run).update(created_at=Now() - Value(timedelta(minutes=10)))
    runs.run_decide(
        run_uuid=run.uuid,
        actor=decider,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="queued",
    )
    waits = series.approval_waits(Window.ending_now())
    assert len(waits) == 1
    assert 600 <= waits[0][1] < 600 + 120


def test_reaper_verdicts_per_day_from_a_real_reaper_pass():
    window = Window.ending_now()
    AgentRunFactory(stale=True)
    AgentRunFactory(stale=True, requeue_count=99)
    reaper.reap_stale_runs(redispatch=False)
    old = AgentRunFactory()
    event(old, 0, EventKind.REAPER, window.now - timedelta(days=30), verdict="requeued")

    data = series.reaper_verdicts_per_day(window)

    assert {s.name: s.values[-1] for s in data.series} == {"dead_lettered": 1, "requeued": 1}
    assert sum(sum(s.values) for s in data.series) == 2


def test_waiting_now_by_age_per_kind():
    fresh = AgentRunFactory(waiting=True)
    hour_old = AgentRunFactory(waiting=True)
    AgentRunFactory(waiting_for_input=True)
    week_old = AgentRunFactory(in_doubt=True)
    AgentRunFactory(running=True)
    AgentRun.objects.filter(pk=hour_old.pk).update(updated_at=Now() - Value(timedelta(minutes=90)))
    AgentRun.objects.filter(pk=week_old.pk).update(updated_at=Now() - Value(timedelta(days=7)))

    data = series.waiting_now_by_age(Window.ending_now())

    assert data.x_labels == ["under 5 min", "5 min – 1 h", "1 h – 1 day", "over 1 day"]
    assert values(data, "approval") == [1, 0, 1, 0]
    assert values(data, "input") == [1, 0, 0, 0]
    assert values(data, "reconciliation") == [0, 0, 0, 1]
    assert fresh.status == Status.WAITING_FOR_APPROVAL


def test_cost_per_configuration_per_day_reads_what_priced_runs_were_charged():
    from decimal import Decimal

    from agentruns.models import SpendDay, SpendScope
    from agentruns.services.runs import run_start_sync

    usage = {"prompt_tokens": 1000, "completion_tokens": 500}  # 0.0075 at 2.50 / 10.00
    priced = AgentConfigurationFactory(
        slug="priced",
        name=HOSTILE,
        price_per_million_prompt_tokens=Decimal("2.50"),
        price_per_million_completion_tokens=Decimal("10.00"),
        script=[{"content": "done", "usage": usage}],
    )
    AgentConfigurationFactory(slug="free", script=[{"content": "done"}])  # unpriced: no series
    for _ in range(2):
        run = run_start_sync(configuration=priced, prompt="hi").run
        assert run.status == Status.COMPLETED
    run_start_sync(configuration=AgentConfiguration.objects.get(slug="free"), prompt="hi")
    # Yesterday's spend of a configuration since deleted: still charted, by its former id.
    yesterday = timezone.now().astimezone(UTC).date() - timedelta(days=1)
    SpendDay.objects.create(day=yesterday, scope=SpendScope.CONFIGURATION, key=9999, amount=1)

    data = series.cost_per_configuration_per_day(Window(now=timezone.now()))

    assert [s.name for s in data.series] == ["deleted configuration #9999", HOSTILE]
    assert values(data, HOSTILE)[-1] == pytest.approx(0.015) and sum(values(data, HOSTILE)) == (
        pytest.approx(0.015)
    )
    assert values(data, "deleted configuration #9999")[-2:] == [1.0, 0.0]
    assert data.unit == "USD"
    assert priced.pk not in {s.name for s in data.series}


def test_cost_chart_names_the_eight_most_expensive_and_sums_the_rest():
    from agentruns.models import SpendDay, SpendScope

    today = timezone.now().astimezone(UTC).date()
    for n in range(10):
        config = AgentConfigurationFactory(slug=f"c{n}", name=f"config {n}")
        SpendDay.objects.create(day=today, scope=SpendScope.CONFIGURATION, key=config.pk, amount=n)

    data = series.cost_per_configuration_per_day(Window(now=timezone.now()))

    assert [s.name for s in data.series][:2] == ["config 9", "config 8"]
    assert len(data.series) == series.COST_SERIES + 1
    assert data.series[-1].name == "2 other configuration(s)"
    assert data.series[-1].values[-1] == 0 + 1


# --- cost: a constant number of queries ---------------------------------------------------------


def test_a_constant_number_of_queries_whatever_the_history():
    counts = []
    for size in (0, 30, 600):
        history(size)
        with CaptureQueriesContext(connection) as drawing:
            drawn = charts.draw_all()
        counts.append(len(drawing))
    assert counts == [len(charts.CHARTS)] * 3
    assert not drawn[0].data.empty and not drawn[-1].data.empty


def test_the_page_costs_the_same_queries_at_small_and_large_history():
    client = login(username="ops", is_superuser=True)
    client.get(URL)  # warm the session and permission caches as a reload would
    with CaptureQueriesContext(connection) as small:
        assert client.get(URL).status_code == 200
    history(900)
    with CaptureQueriesContext(connection) as large:
        assert client.get(URL).status_code == 200
    assert len(small) == len(large)


# --- text stays text, nothing leaves the page ----------------------------------------------------


def test_a_hostile_label_is_escaped_in_the_svg():
    data = ChartData(
        x_labels=[HOSTILE, "b"],
        series=[Series(HOSTILE, [1, 2]), Series('"><img src=x onerror=alert(2)>', [3, 4])],
        unit="runs",
    )
    drawn = svg.render(data, kind="stacked", label=HOSTILE)
    assert HOSTILE not in drawn and "<img" not in drawn
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in drawn
    assert "<script" not in drawn


def test_a_hostile_configuration_name_and_verdict_stay_text_on_the_page():
    configuration = AgentConfigurationFactory(slug="hostile", name=HOSTILE)
    run = AgentRunFactory(configuration=configuration)
    event(run, 0, EventKind.REAPER, timezone.now(), rule=HOSTILE, verdict=HOSTILE)
    html = login(username="ops", is_superuser=True).get(URL).content.decode()
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the legend, the table


def test_nothing_on_the_page_loads_from_elsewhere_and_no_script_runs():
    history(20)
    html = login(username="ops", is_superuser=True).get(URL).content.decode()
    charts_html = html[html.index('id="content-main"') :]
    assert "<script" not in charts_html
    assert "pygal.org" not in html and "kozea" not in html.lower()
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls  # a namespace name, never fetched


def test_reaper_verdicts_count_the_approval_deadlines_the_pass_settled(probes):
    from tests.agentruns.support.deadlines import AT_ONCE, waiting_for_approval, waiting_for_input

    waiting_for_approval(timeout=AT_ONCE, action="deny")
    waiting_for_approval(timeout=AT_ONCE, action="fail")
    waiting_for_input(timeout=AT_ONCE, action="deny")
    waiting_for_approval()  # its deadline is far: not settled, not counted
    report = reaper.reap_stale_runs()
    assert len(report.expired) == 3

    data = series.reaper_verdicts_per_day(Window(now=timezone.now()))

    assert {s.name: sum(s.values) for s in data.series} == {
        "deadline: denied": 2,
        "deadline: failed": 1,
    }
