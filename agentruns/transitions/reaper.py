"""The reaper's transitions, called inside its locked batch; each re-checks staleness in its own
``UPDATE``. ``runs_reap_stale`` settles a whole batch set-based; the per-run transitions remain
for its fallback and for the wake-ups that could not be sent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction

from agentruns.leases import EventSpec
from agentruns.transitions._batch import (
    batch_write,
    chain_batch_events,
    insert_batch_events,
    tail_values,
)
from agentruns.transitions._writer import guarded_write, json_text, state_write
from agentruns.turns import (
    PendingTurn,
)

# --- The reaper's transitions (called inside its locked batch) -----------------------------------


@state_write
def runs_reap_stale(
    *,
    in_doubt: Mapping[int, PendingTurn],
    dead_lettered: Mapping[int, tuple[str, Mapping[str, Any]]],
    reclaim: Iterable[int],
    events: Mapping[int, EventSpec],
    segment: str,
) -> set[int]:
    """A reaper batch's verdicts, set-based: one guarded ``UPDATE … RETURNING`` per verdict
    kind, then one ``reaper`` event (``events[run_id]``) for each run an ``UPDATE`` took, in
    one transaction (a savepoint inside the batch's). Returns the ids of the runs taken.

    * ``in_doubt`` — run id → its reconciliation turn; as ``run_mark_in_doubt``: stale and
      fence ``non_idempotent_write`` → ``waiting_for_reconciliation``, claim and lease cleared,
      fence kept.
    * ``dead_lettered`` — run id → (termination reason, error); as ``run_settle(stale_only=
      True)``: stale → ``failed``, claim, lease, fence and pending turn cleared.
    * ``reclaim`` — run ids; as ``run_reclaim_stale``: stale → ``queued``, budget + 1, claim and
      fence cleared.

    Guard: the same as each per-run transition's, staleness re-checked row by row in its
    ``UPDATE``. An id missing from the result: renewed or changed meanwhile — skip it, it got no
    event. Call only while holding the runs' rows (the batch's ``FOR UPDATE``).
    """
    with transaction.atomic():
        # Numbered and chained before the UPDATEs, which write each run's new ledger head with
        # its verdict: a run an UPDATE skips keeps its head and gets no event.
        chained = chain_batch_events(events, segment=segment, epoch=0)
        taken = batch_write(
            "reap_in_doubt",
            {
                run_id: {"pending_turn": json_text(turn.to_json()), **tail_values(chained, run_id)}
                for run_id, turn in in_doubt.items()
            },
        )
        taken |= batch_write(
            "reap_failed",
            {
                run_id: {
                    "termination_reason": str(reason),
                    "error": json_text(dict(error)),
                    **tail_values(chained, run_id),
                }
                for run_id, (reason, error) in dead_lettered.items()
            },
        )
        taken |= batch_write(
            "reap_reclaim", {run_id: tail_values(chained, run_id) for run_id in reclaim}
        )
        insert_batch_events(
            {run_id: event for run_id, event in events.items() if run_id in taken},
            chained,
            segment=segment,
            epoch=0,
        )
    return taken


@state_write
def run_reclaim_stale(*, run_id: int, segment: str, event: EventSpec) -> bool:
    """Take a stale run back to ``queued`` for a worker: budget + 1, claim and fence cleared
    (the statement ``reclaim_stale``).

    Guard: ``running`` and ``lease_expires < Now()``, re-checked in the UPDATE itself. ``False``:
    the holder renewed meanwhile — skip it.
    """
    return guarded_write("reclaim_stale", {"run_id": run_id}, [event], segment=segment) is not None


@state_write
def run_mark_in_doubt(
    *, run_id: int, pending_turn: PendingTurn, segment: str, event: EventSpec
) -> bool:
    """Park a stale run caught mid non-idempotent write in ``waiting_for_reconciliation`` (the
    statement ``mark_in_doubt``).

    Guard: ``running``, ``lease_expires < Now()`` and fence ``non_idempotent_write``. Claim and
    lease cleared; ``pending_effect``/``pending_call`` kept for the reconciler. ``False``: skip.
    """
    params = {"run_id": run_id, "pending_turn": pending_turn.to_json()}
    return guarded_write("mark_in_doubt", params, [event], segment=segment) is not None


@state_write
def run_settle_undispatched(
    *, run_id: int, lease_epoch: int, error: Mapping[str, Any], segment: str, event: EventSpec
) -> bool:
    """Settle a run the reaper reclaimed but whose wake-up could not be sent: ``failed`` /
    ``not_retryable``, never left ``queued`` with nothing to wake it (docs/design.md §8.3; the
    statement ``settle_undispatched``).

    Guard: ``queued``, unclaimed and still at ``lease_epoch`` (the epoch the reclaim left), so a
    worker that claimed it meanwhile (a stale or duplicate task) keeps it. ``False``: skip.
    """
    params = {"run_id": run_id, "lease_epoch": lease_epoch, "error": dict(error)}
    return guarded_write("settle_undispatched", params, [event], segment=segment) is not None


@state_write
def run_mark_redispatched(
    *, run_id: int, older_than_seconds: float, segment: str, event: EventSpec
) -> bool:
    """Note that the reaper is about to send a fresh wake-up to a queued run nobody claimed (the
    statement ``mark_redispatched``).

    Guard: ``queued``, unclaimed and ``updated_at`` older than ``older_than_seconds`` on the
    database clock (re-checked here, so of two reapers only one redispatches). Bumps
    ``updated_at`` (the next redispatch waits a whole period) and appends ``event``. ``False``:
    claimed, touched, cancelled or settled meanwhile — send nothing.
    """
    params = {"run_id": run_id, "older_than_seconds": older_than_seconds}
    return guarded_write("mark_redispatched", params, [event], segment=segment) is not None
