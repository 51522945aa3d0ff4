"""The one write of an external agent loop that no segment of Leasehold's own makes: saving the
framework's state with its run (docs/external.md). Births, claims, boundaries, fences, suspends
and settles of an external run are the segment writes every run uses (``segment_writes``,
``endings``), with the framework named where it matters (``run_start``,
``run_claim_queued_row``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.db.models.functions import Now

from agentruns.leases import Lease
from agentruns.models import AgentRun, Status
from agentruns.transitions._writer import state_write

#: Where a run may be when the loop that paused it saves its state: waiting for a person, or
#: already decided and queued for its loop, with nobody holding it since (the epoch pins that).
_PAUSED = (
    Status.WAITING_FOR_APPROVAL,
    Status.WAITING_FOR_INPUT,
    Status.WAITING_FOR_RECONCILIATION,
    Status.QUEUED,
)


@state_write
def run_save_external_state(lease: Lease, *, state: Any, paused: bool = False) -> bool:
    """Save ``state`` as the run's ``external_state`` (checked and bounded by the caller).

    Guard: the owner (``running``, ``claimed_by``, ``lease_epoch``); with ``paused``, the loop
    that just suspended the run under ``lease``: a waiting or queued run, unclaimed, still at the
    lease's epoch (a claim since, by anyone, raised it). ``False``: the lease is lost, or the
    run moved on — nothing was written.
    """
    if paused:
        guard = Q(status__in=_PAUSED, claimed_by="")
    else:
        guard = Q(status=Status.RUNNING, claimed_by=lease.owner)
    updated = AgentRun.objects.filter(guard, pk=lease.run_id, lease_epoch=lease.epoch).update(
        external_state=state, updated_at=Now()
    )
    return updated == 1
