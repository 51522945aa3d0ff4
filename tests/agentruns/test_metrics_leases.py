"""``leasehold_lease_renewals_total`` and ``leasehold_leases_lost_total`` (issue 14 §5): tallied in
the process, written once when a segment ends, and never able to fail a segment."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from agentruns import metrics
from agentruns.models import AgentRun, Counter, Status
from agentruns.services.runs import run_start_sync
from agentruns.services.runtime import ticker
from agentruns.services.runtime.results import Outcome
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.leases import take_over
from tests.agentruns.support.runtime import call, config, tool_turn


def counted(name: str) -> int:
    row = Counter.objects.filter(name=name, labels="").first()
    return row.value if row is not None else 0


def scrape() -> str:
    client = Client()
    client.force_login(UserFactory(username="ops", permissions=["agentruns.view_all_agentruns"]))
    return client.get("/metrics").content.decode()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_renewals_are_counted_once_when_the_segment_ends():
    ticker.take_renewals()  # what other tests' tickers left in this process
    script = [tool_turn(call("wait", seconds=0.7)), {"content": "done"}]
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEASE_SECONDS": 0.45}):
        result = run_start_sync(
            configuration=config(tools=["wait"]), prompt="p", options={"script": script}
        )

    assert result.outcome == Outcome.COMPLETED
    renewals = counted(metrics.LEASE_RENEWALS)
    # The ticker renews every 0.15 s while the 0.7 s call runs: several renewals, all counted.
    assert renewals >= 2
    assert ticker._renewals_untold.get((result.run.pk, result.run.lease_epoch), 0) == 0
    assert f"leasehold_lease_renewals_total {float(renewals)}" in scrape()
    assert "leasehold_leases_lost_total 0.0" in scrape()


@pytest.mark.django_db
def test_a_segment_that_lost_its_lease_is_counted(probes):
    taken: dict = {}

    def take_during_first_call(entry):
        if not taken:
            taken["lease"] = take_over(AgentRun.objects.get().pk)

    probes.during = take_during_first_call
    script = [tool_turn(call("probe_read", value="a")), {"content": "done"}]
    result = run_start_sync(configuration=config(), prompt="p", options={"script": script})

    assert result.outcome == Outcome.LEASE_LOST
    assert counted(metrics.LEASES_LOST) == 1
    assert "leasehold_leases_lost_total 1.0" in scrape()


@pytest.mark.django_db
def test_a_segment_without_renewals_writes_no_counter():
    ticker.take_renewals()
    with CaptureQueriesContext(connection) as queries:
        metrics.record_segment_end(lease=None, lease_lost=False)
    assert len(queries) == 0


@pytest.mark.django_db
def test_a_failed_count_never_fails_and_keeps_the_renewals_for_the_next_segment():
    ticker.take_renewals()
    ticker.give_back_renewals(5)
    with connection.cursor() as cursor:  # a real failure; the test's transaction restores it
        cursor.execute(f"DROP TABLE {Counter._meta.db_table}")

    metrics.record_segment_end(lease=None, lease_lost=True)  # logs, does not raise

    assert ticker.take_renewals() == 5
    # The caller's transaction is still usable (the write was in a savepoint).
    assert AgentRun.objects.filter(status=Status.RUNNING, updated_at__lt=Now()).count() == 0
