"""The reaper's transitions, called inside its locked batch; each re-checks staleness in its own
``UPDATE``. ``runs_reap_stale`` settles a whole batch set-based; the per-run transitions remain
for its fallback and for the wake-ups that could not be sent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from agentruns.leases import EventSpec
from agentruns.models import (
    AgentRun,
    Effect,
    Status,
    TerminationReason,
)
from agentruns.transitions._batch import (
    batch_update,
    chain_batch_events,
    increment_sql,
    insert_batch_events,
    now_sql,
    stale_guard_sql,
    tail_values,
)
from agentruns.transitions._writer import (
    DbValue,
    guarded_write,
    stale,
    state_write,
)
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
    stale_params = [str(Status.RUNNING)]
    with transaction.atomic():
        # Numbered and chained before the UPDATEs, which write each run's new ledger head with
        # its verdict: a run an UPDATE skips keeps its head and gets no event.
        chained = chain_batch_events(events, segment=segment, epoch=0)
        taken = batch_update(
            guard=stale_guard_sql() + f" AND {_pending_effect_sql()} = %s",
            guard_params=[*stale_params, str(Effect.NON_IDEMPOTENT_WRITE)],
            fixed={
                "status": Status.WAITING_FOR_RECONCILIATION,
                "claimed_by": "",
                "lease_expires": None,
            },
            per_run={
                run_id: {"pending_turn": turn.to_json(), **tail_values(chained, run_id)}
                for run_id, turn in in_doubt.items()
            },
        )
        taken |= batch_update(
            guard=stale_guard_sql(),
            guard_params=stale_params,
            fixed={
                "status": Status.FAILED,
                "output": "",
                "claimed_by": "",
                "lease_expires": None,
                "pending_effect": "",
                "pending_call": None,
                "pending_turn": None,
                "finished_at": now_sql(),
            },
            per_run={
                run_id: {
                    "termination_reason": reason,
                    "error": dict(error),
                    **tail_values(chained, run_id),
                }
                for run_id, (reason, error) in dead_lettered.items()
            },
        )
        taken |= batch_update(
            guard=stale_guard_sql(),
            guard_params=stale_params,
            fixed={
                "status": Status.QUEUED,
                "requeue_count": increment_sql("requeue_count"),
                "claimed_by": "",
                "lease_expires": None,
                "pending_effect": "",
                "pending_call": None,
            },
            per_run={run_id: tail_values(chained, run_id) for run_id in reclaim},
        )
        insert_batch_events(
            {run_id: event for run_id, event in events.items() if run_id in taken},
            chained,
            segment=segment,
            epoch=0,
        )
    return taken


def _pending_effect_sql() -> str:
    return connection.ops.quote_name(AgentRun._meta.get_field("pending_effect").column)


@state_write
def run_reclaim_stale(*, run_id: int, segment: str, event: EventSpec) -> bool:
    """Take a stale run back to ``queued`` for a worker: budget + 1, claim and fence cleared.

    Guard: ``running`` and ``lease_expires < Now()``, re-checked in the UPDATE itself. ``False``:
    the holder renewed meanwhile — skip it.
    """
    return guarded_write(
        run_id,
        stale(),
        {
            "status": Status.QUEUED,
            "requeue_count": DbValue.INCREMENT,
            "claimed_by": "",
            "lease_expires": None,
            "pending_effect": "",
            "pending_call": None,
        },
        [event],
        segment=segment,
    )


@state_write
def run_mark_in_doubt(
    *, run_id: int, pending_turn: PendingTurn, segment: str, event: EventSpec
) -> bool:
    """Park a stale run caught mid non-idempotent write in ``waiting_for_reconciliation``.

    Guard: ``running``, ``lease_expires < Now()`` and fence ``non_idempotent_write``. Claim and
    lease cleared; ``pending_effect``/``pending_call`` kept for the reconciler. ``False``: skip.
    """
    return guarded_write(
        run_id,
        stale() & Q(pending_effect=Effect.NON_IDEMPOTENT_WRITE),
        {
            "status": Status.WAITING_FOR_RECONCILIATION,
            "claimed_by": "",
            "lease_expires": None,
            "pending_turn": pending_turn.to_json(),
        },
        [event],
        segment=segment,
    )


@state_write
def run_settle_undispatched(
    *, run_id: int, lease_epoch: int, error: Mapping[str, Any], segment: str, event: EventSpec
) -> bool:
    """Settle a run the reaper reclaimed but whose wake-up could not be sent: ``failed`` /
    ``not_retryable``, never left ``queued`` with nothing to wake it (docs/design.md §8.3).

    Guard: ``queued``, unclaimed and still at ``lease_epoch`` (the epoch the reclaim left), so a
    worker that claimed it meanwhile (a stale or duplicate task) keeps it. ``False``: skip.
    """
    return guarded_write(
        run_id,
        Q(status=Status.QUEUED, claimed_by="", lease_epoch=lease_epoch),
        {
            "status": Status.FAILED,
            "termination_reason": TerminationReason.NOT_RETRYABLE,
            "error": dict(error),
            "pending_turn": None,
            "finished_at": DbValue.NOW,
        },
        [event],
        segment=segment,
    )


@state_write
def run_mark_redispatched(
    *, run_id: int, older_than_seconds: float, segment: str, event: EventSpec
) -> bool:
    """Note that the reaper is about to send a fresh wake-up to a queued run nobody claimed.

    Guard: ``queued``, unclaimed and ``updated_at`` older than ``older_than_seconds`` on the
    database clock (re-checked here, so of two reapers only one redispatches). Bumps
    ``updated_at`` (the next redispatch waits a whole period) and appends ``event``. ``False``:
    claimed, touched, cancelled or settled meanwhile — send nothing.
    """
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=older_than_seconds)), output_field=DateTimeField()
    )
    return guarded_write(
        run_id,
        Q(status=Status.QUEUED, claimed_by="", updated_at__lt=cutoff),
        {},
        [event],
        segment=segment,
    )
