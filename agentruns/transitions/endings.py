"""Endings: settling a run, cancelling it, abandoning it when its client went away."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db.models import Q

from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    TERMINAL_STATUSES,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.transitions._writer import (
    DbValue,
    guarded_write,
    segment_write,
    stale,
    state_write,
)

NON_TERMINAL = [s for s in Status.values if s not in TERMINAL_STATUSES]
NOT_IN_DOUBT = [s for s in NON_TERMINAL if s != Status.WAITING_FOR_RECONCILIATION]


# --- Endings -------------------------------------------------------------------------------------


@state_write
def run_settle(
    *,
    run_id: int,
    status: str,
    reason: str,
    lease: Lease | None = None,
    stale_only: bool = False,
    output: str = "",
    error: Mapping[str, Any] | None = None,
    totals: Mapping[str, Any] | None = None,
    events: Iterable[EventSpec] = (),
    segment: str = "",
) -> bool:
    """Move a run to a terminal status with its reason, output and totals.

    Guard: status non-terminal; with ``lease``, also owner (a segment's own settle); with
    ``stale_only``, also ``running`` and ``lease_expires < Now()`` (the reaper). Claim, lease and
    fence are cleared. ``False``: already terminal or no longer ours — the first outcome stands.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status!r} is not terminal")
    values: dict[str, Any] = {
        "status": status,
        "termination_reason": reason,
        "output": output,
        "error": dict(error or {}),
        "claimed_by": "",
        "lease_expires": None,
        "pending_effect": "",
        "pending_call": None,
        "pending_turn": None,
        "finished_at": DbValue.NOW,
        **dict(totals or {}),
    }
    if lease is not None:
        return segment_write(lease, values, events)
    guard = stale() if stale_only else Q(status__in=NON_TERMINAL)
    return guarded_write(run_id, guard, values, events, segment=segment)


@state_write
def run_cancel(
    *, run_id: int, actor_id: int | None = None, note: str = "", in_doubt: bool = True
) -> bool:
    """Cancel a non-terminal run. ``False``: already terminal — nothing changes.

    Guard: status non-terminal; with ``in_doubt=False`` also not ``waiting_for_reconciliation``
    (the caller may not end a run in doubt: ``False`` then too, and the caller tells the two
    apart). A running holder keeps its ``claimed_by``/``lease_epoch`` so that it recognises the
    cancel at its next boundary (``run_notice_cancel``); the lease itself ends now, and so does a
    waiting run's approval deadline (cleared with its action).
    """
    return guarded_write(
        run_id,
        Q(status__in=NON_TERMINAL if in_doubt else NOT_IN_DOUBT),
        {
            "status": Status.CANCELLED,
            "termination_reason": TerminationReason.CANCELLED,
            "lease_expires": None,
            "pending_turn": None,
            "approval_deadline": None,
            "approval_timeout_action": "",
            "finished_at": DbValue.NOW,
        },
        [EventSpec(EventKind.CANCEL, {"note": note}, actor_id=actor_id)],
    )


@state_write
def run_abandon(lease: Lease, *, note: str = "") -> bool:
    """Settle a run whose interactive client went away mid-stream: ``failed`` / ``abandoned``.

    Guard: owner (``running``, ``claimed_by`` and ``lease_epoch`` of ``lease``) and no fence: a
    write in flight is never cut off from its audit event, so a fenced run is refused and the
    caller retries at the segment's next boundary. Claim and lease are cleared, so the segment
    still executing under ``lease`` finds its next boundary write matching nothing (lease lost)
    and stops. May be called from another thread than the segment's: the ``lease`` event is
    sequenced from the table, not from the segment's counter. ``False``: fenced, already paused
    or ended, or the lease was lost — nothing changed.
    """
    return guarded_write(
        lease.run_id,
        Q(
            status=Status.RUNNING,
            claimed_by=lease.owner,
            lease_epoch=lease.epoch,
            pending_effect="",
        ),
        {
            "status": Status.FAILED,
            "termination_reason": TerminationReason.ABANDONED,
            "error": {"type": "Abandoned", "message": "the client went away mid-stream"},
            "claimed_by": "",
            "lease_expires": None,
            "pending_turn": None,
            "finished_at": DbValue.NOW,
        },
        [EventSpec(EventKind.LEASE, {"action": "abandoned", "note": note})],
        segment=lease.owner,
        epoch=lease.epoch,
    )
