"""Taking a run over: what a reaper and another worker do to a run whose holder looks dead."""

from __future__ import annotations

from datetime import timedelta

from django.db.models.functions import Now

from agentruns import transitions
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, EventKind
from tests.agentruns.support.transitions import claim_lease


def reclaim_and_claim(run: AgentRun) -> Lease:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert transitions.run_reclaim_stale(
        run_id=run.pk,
        segment="reaper:test:1",
        event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
    )
    lease = claim_lease(run_id=run.pk, identity="worker:elsewhere:7")
    assert lease is not None
    return lease


OTHER_WORKER = "worker:other-host:4242"


def take_over(run_id: int) -> Lease:
    """What a reaper and another worker do to a run whose holder looks dead."""
    AgentRun.objects.filter(pk=run_id).update(lease_expires=Now() - timedelta(minutes=5))
    assert transitions.run_reclaim_stale(
        run_id=run_id,
        segment="reaper:test:1",
        event=EventSpec(EventKind.REAPER, {"rule": "reclaim"}),
    )
    lease = claim_lease(run_id=run_id, identity=OTHER_WORKER)
    assert lease is not None
    return lease
