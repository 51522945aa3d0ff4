"""Every guarded write on a run's status, lease and fence columns (docs/design.md §2).

Each state change is one filtered ``UPDATE`` whose ``WHERE`` is the guard and whose row count is
the verdict, or — for a decision that must read, check and claim — one transaction holding the
row lock (``select_for_update``; on SQLite the IMMEDIATE transaction serialises writers instead).
Nothing else in the code base writes these columns.

Conventions:

* Lease arithmetic and comparisons use the database clock (``Now()``), never the app server's.
* "Owner" means ``claimed_by`` **and** ``lease_epoch``: a zombie holding an older epoch of the
  same identity matches nothing.
* Segment writes return ``bool`` (``run_suspend``: the parked row or ``None``): ``False`` means
  the lease is lost (or the run was cancelled) and the caller must stop at once — settle
  nothing, write no event, start no write.
* Decisions raise a typed refusal (``StaleTurn``, ``AlreadyDecided``, ``NotWaiting``, …) and
  change nothing when refused.
* A database error never escapes as a bare ``DatabaseError``: it becomes ``StateWriteFailed``
  after the transaction rolled back.
* Events written with a state change are inserted in the same transaction, after the guarded
  ``UPDATE`` took the row, so an event exists if and only if its change took effect.
* Each guarded statement is written out whole and named, once per database
  (``transitions/sql/postgresql.sql`` and ``transitions/sql/sqlite.sql``), its guard in its
  ``WHERE`` and its parameters bound; a transition names its statement and passes its
  parameters to the writer (``_writer.write``), which returns the run's row as the statement
  returns it, or ``None`` when the guard matched nothing.
"""

from __future__ import annotations

from agentruns.transitions.deadlines import (
    run_expire_waiting,
)
from agentruns.transitions.deciding import (
    locked_waiting_run,
    record_abandon,
    record_decision,
    run_decide,
    run_reconcile_abandon,
)
from agentruns.transitions.endings import (
    run_abandon,
    run_cancel,
    run_settle,
)
from agentruns.transitions.in_doubt import locked_check_turn, record_check
from agentruns.transitions.reaper import (
    run_mark_in_doubt,
    run_mark_redispatched,
    run_reclaim_stale,
    run_settle_undispatched,
    runs_reap_stale,
)
from agentruns.transitions.segment_writes import (
    birth_event,
    run_claim_queued_row,
    run_clear_fence,
    run_enqueue,
    run_hand_back,
    run_heartbeat,
    run_notice_cancel,
    run_park_in_doubt,
    run_requeue,
    run_stamp_fence,
    run_start,
    run_suspend,
)

__all__ = [
    "birth_event",
    "locked_check_turn",
    "locked_waiting_run",
    "record_abandon",
    "record_check",
    "record_decision",
    "run_abandon",
    "run_cancel",
    "run_claim_queued_row",
    "run_clear_fence",
    "run_decide",
    "run_enqueue",
    "run_expire_waiting",
    "run_hand_back",
    "run_heartbeat",
    "run_mark_in_doubt",
    "run_mark_redispatched",
    "run_notice_cancel",
    "run_park_in_doubt",
    "run_reclaim_stale",
    "run_reconcile_abandon",
    "run_requeue",
    "run_settle",
    "run_settle_undispatched",
    "run_stamp_fence",
    "run_start",
    "run_suspend",
    "runs_reap_stale",
]
