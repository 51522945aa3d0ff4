"""``/metrics`` (issue 14 §5): who may read it, what it says, and what it costs."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Value
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from agentruns.metrics import counter_add
from agentruns.models import AgentRun, Counter, Status
from agentruns.services import reaper
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory
from tests.agentruns.support.metrics import samples

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-scraper-token"


VIEW_ALL = "agentruns.view_all_agentruns"
DECIDE = "agentruns.decide_agentrun"


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(username="ops", is_staff=True, permissions=[VIEW_ALL]))
    return client


def logged_in(**fields) -> Client:
    client = Client()
    client.force_login(UserFactory(**fields))
    return client


def test_anonymous_is_401_and_a_non_staff_user_403():
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    client = logged_in(username="someone", is_staff=False, permissions=[VIEW_ALL])
    assert client.get("/metrics").status_code == 403


def test_a_session_needs_the_dashboards_permission():
    """/metrics counts every run, as the dashboard does: a staff session needs what the dashboard
    needs (``view_all_agentruns`` or ``decide_agentrun``); the token path is unchanged."""
    bare = logged_in(username="bare")
    assert bare.get("/metrics").status_code == 403
    assert bare.get("/admin/agentruns/agentrun/dashboard/").status_code == 403
    for username, permission in (("viewer", VIEW_ALL), ("decider", DECIDE)):
        client = logged_in(username=username, permissions=[permission])
        assert samples(client), permission
        assert client.get("/admin/agentruns/agentrun/dashboard/").status_code == 200
    assert samples(logged_in(username="root", is_superuser=True))
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "METRICS_TOKEN": TOKEN}):
        # A bearer token needs no session and no permission; a wrong one is refused even
        # beside a session that could read.
        assert samples(Client(), Authorization=f"Bearer {TOKEN}")
        viewer = logged_in(username="viewer2", permissions=[VIEW_ALL])
        wrong = viewer.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403


def test_a_scraper_reads_with_the_bearer_token_and_nothing_else():
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "METRICS_TOKEN": TOKEN}):
        assert samples(Client(), Authorization=f"Bearer {TOKEN}")
        for wrong in (f"Bearer {TOKEN}x", "Bearer ", f"Token {TOKEN}", TOKEN):
            assert Client().get("/metrics", headers={"Authorization": wrong}).status_code == 403
    # Without a configured token no bearer is accepted, not even an empty one.
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 403


def test_runs_by_status_waiting_ages_in_doubt_and_stale(staff):
    configuration = AgentConfigurationFactory()
    AgentRunFactory.create_batch(2, configuration=configuration, status=Status.COMPLETED)
    waiting = AgentRunFactory(configuration=configuration, waiting=True)
    AgentRunFactory(configuration=configuration, waiting=True)
    AgentRunFactory(configuration=configuration, in_doubt=True)
    AgentRunFactory(configuration=configuration, stale=True)
    AgentRun.objects.filter(pk=waiting.pk).update(updated_at=Now() - Value(timedelta(hours=2)))

    values = samples(staff)

    assert values[("leasehold_runs", (("status", "completed"),))] == 2
    assert values[("leasehold_runs", (("status", "waiting_for_approval"),))] == 2
    assert values[("leasehold_runs", (("status", "cancelled"),))] == 0
    assert values[("leasehold_runs_in_doubt", ())] == 1
    assert values[("leasehold_stale_runs", ())] == 1
    approval_age = values[("leasehold_oldest_waiting_seconds", (("kind", "approval"),))]
    assert 7200 <= approval_age < 7200 + 600
    assert values[("leasehold_oldest_waiting_seconds", (("kind", "input"),))] == 0


def test_reaper_verdicts_are_counted_by_rule_and_a_dry_run_counts_nothing(staff):
    configuration = AgentConfigurationFactory()
    AgentRunFactory(configuration=configuration, stale=True)
    AgentRunFactory(configuration=configuration, stale=True, fenced=True)
    reaper.reap_stale_runs(dry_run=True)
    assert not Counter.objects.exists()

    reaper.reap_stale_runs()
    reaper.reap_stale_runs()  # nothing stale any more: a pass, no verdicts

    values = samples(staff)
    assert (
        values[("leasehold_reaper_verdicts_total", (("rule", "reclaim"), ("verdict", "requeued")))]
        == 1
    )
    assert (
        values[("leasehold_reaper_verdicts_total", (("rule", "fence"), ("verdict", "in_doubt")))]
        == 1
    )
    assert values[("leasehold_reaper_passes_total", ())] == 2


def test_a_scrape_costs_the_same_queries_whatever_the_history(staff):
    configuration = AgentConfigurationFactory()

    def scrape_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            samples(staff)
        return len(queries)

    AgentRunFactory.create_batch(3, configuration=configuration, status=Status.COMPLETED)
    few = scrape_queries()
    AgentRunFactory.create_batch(60, configuration=configuration, status=Status.FAILED)
    AgentRunFactory.create_batch(20, configuration=configuration, waiting=True)
    assert scrape_queries() == few


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_counters_raised_from_many_threads_lose_nothing():
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def raise_it() -> None:
        try:
            barrier.wait()
            for _ in range(25):
                counter_add("test_total", rule="r")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=raise_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert Counter.objects.get(name="test_total", labels="rule=r").value == 100
