"""Endings: settling a run, cancelling it, abandoning it when its client went away."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agentruns.leases import EventSpec, Lease
from agentruns.models import TERMINAL_STATUSES, EventKind
from agentruns.transitions._writer import guarded_write, segment_write, state_write

#: The run's columns a settle may also write (``totals``): tokens, cost, rounds, the loop state,
#: a structured answer (``output_object``).
TOTALS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost",
    "iterations",
    "truncated",
    "loop_state",
    "output_object",
)


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
    """Move a run to a terminal status with its reason, output and totals (``TOTALS``).

    Guard: with ``lease``, the owner (a segment's own settle: the statement ``settle_own``);
    with ``stale_only``, ``running`` and ``lease_expires < Now()`` (the reaper:
    ``settle_stale``); else status non-terminal (``settle_unfinished``). Claim, lease and fence
    are cleared. ``False``: already terminal or no longer ours — the first outcome stands.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status!r} is not terminal")
    totals = dict(totals or {})
    if unknown := set(totals) - set(TOTALS):
        raise ValueError(f"a settle writes no {sorted(unknown)}")
    params = {
        "status": str(status),
        "termination_reason": str(reason),
        "output": output,
        "error": dict(error or {}),
        **{name: totals.get(name) for name in TOTALS},
    }
    if lease is not None:
        return segment_write(lease, "settle_own", params, events) is not None
    statement = "settle_stale" if stale_only else "settle_unfinished"
    params["run_id"] = run_id
    return guarded_write(statement, params, events, segment=segment) is not None


@state_write
def run_cancel(
    *, run_id: int, actor_id: int | None = None, note: str = "", in_doubt: bool = True
) -> bool:
    """Cancel a non-terminal run. ``False``: already terminal — nothing changes.

    Guard: status non-terminal (the statement ``cancel``); with ``in_doubt=False`` also not
    ``waiting_for_reconciliation`` (``cancel_unless_in_doubt``: the caller may not end a run in
    doubt; ``False`` then too, and the caller tells the two apart). A running holder keeps its
    ``claimed_by``/``lease_epoch`` so that it recognises the cancel at its next boundary
    (``run_notice_cancel``); the lease itself ends now, and so does a waiting run's approval
    deadline (cleared with its action).
    """
    return (
        guarded_write(
            "cancel" if in_doubt else "cancel_unless_in_doubt",
            {"run_id": run_id},
            [EventSpec(EventKind.CANCEL, {"note": note}, actor_id=actor_id)],
        )
        is not None
    )


@state_write
def run_abandon(lease: Lease, *, note: str = "") -> bool:
    """Settle a run whose interactive client went away mid-stream: ``failed`` / ``abandoned``
    (the statement ``abandon``).

    Guard: owner (``running``, ``claimed_by`` and ``lease_epoch`` of ``lease``) and no fence: a
    write in flight is never cut off from its audit event, so a fenced run is refused and the
    caller retries at the segment's next boundary. Claim and lease are cleared, so the segment
    still executing under ``lease`` finds its next boundary write matching nothing (lease lost)
    and stops. May be called from another thread than the segment's: the ``lease`` event is
    sequenced from the table, not from the segment's counter. ``False``: fenced, already paused
    or ended, or the lease was lost — nothing changed.
    """
    params = {
        "run_id": lease.run_id,
        "owner": lease.owner,
        "epoch": lease.epoch,
        "error": {"type": "Abandoned", "message": "the client went away mid-stream"},
    }
    event = EventSpec(EventKind.LEASE, {"action": "abandoned", "note": note})
    return (
        guarded_write("abandon", params, [event], segment=lease.owner, epoch=lease.epoch)
        is not None
    )
