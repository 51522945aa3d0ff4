"""The lease ticker: renews while a block runs, stops when it ends, reports a lost lease."""

from __future__ import annotations

import time

import pytest

from agentruns.models import AgentRun
from agentruns.services.runtime.ticker import LeaseTicker
from tests.agentruns.factories import AgentRunFactory, lease_for

pytestmark = pytest.mark.django_db(transaction=True)


def expiry(run: AgentRun):
    return AgentRun.objects.values_list("lease_expires", flat=True).get(pk=run.pk)


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_tickers_of_several_segments_renew_together_and_stop_with_their_block():
    first, second = AgentRunFactory(running=True), AgentRunFactory(running=True)
    zombie_run = AgentRunFactory(running=True)
    zombie = lease_for(zombie_run)
    zombie.epoch += 1  # a token the row no longer carries
    before = expiry(first)

    with (
        LeaseTicker(lease_for(first), interval=0.05) as a,
        LeaseTicker(lease_for(second), interval=0.08) as b,
        LeaseTicker(zombie, interval=0.05) as z,
    ):
        _wait_until(lambda: a.renewals >= 3 and b.renewals >= 3 and z.lost)
    renewed = expiry(first)
    counts = (a.renewals, b.renewals)

    assert renewed > before
    assert z.lost and z.renewals == 0
    assert not a.lost and not b.lost
    time.sleep(0.3)  # the block has ended: nothing renews any more
    assert (a.renewals, b.renewals) == counts
    assert expiry(first) == renewed


def test_a_ticker_reports_a_lease_lost_while_it_runs():
    run = AgentRunFactory(running=True)

    with LeaseTicker(lease_for(run), interval=0.05) as ticker:
        _wait_until(lambda: ticker.renewals >= 1)
        AgentRun.objects.filter(pk=run.pk).update(claimed_by="worker:someone-else:1")
        _wait_until(lambda: ticker.lost)

    assert ticker.lost


def test_a_call_under_a_default_ticker_does_not_wake_the_idle_thread(monkeypatch):
    """Every provider and tool call registers a ticker with the default interval: the idle
    scheduler thread already plans to wake sooner than that ticker is due, so registering it
    sends no wake-up (a thread switch per call); a shorter interval still does."""
    from agentruns.services.runtime import ticker as module

    lease = lease_for(AgentRunFactory(running=True))
    with LeaseTicker(lease, interval=0.01) as started:  # the thread is running
        _wait_until(lambda: started.renewals >= 1)
    scheduler = module._scheduler

    def idle() -> bool:  # the thread has seen the block end and waits for a long while
        with scheduler._cond:
            wake_at = scheduler._wake_at
            return not scheduler._due and (wake_at is None or wake_at > time.monotonic() + 5)

    _wait_until(idle)
    wakes = []
    condition = module._scheduler._cond
    original = condition.notify
    monkeypatch.setattr(condition, "notify", lambda n=1: (wakes.append(n), original(n)))

    for _ in range(20):
        with LeaseTicker(lease):
            pass
    assert wakes == []
    with LeaseTicker(lease, interval=0.01) as short:
        _wait_until(lambda: short.renewals >= 1)
    assert wakes
