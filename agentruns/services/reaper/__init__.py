"""The stale-run reaper (docs/design.md §8): every run whose lease expired ends in a defined state.

For each ``running`` run with ``lease_expires < Now()`` (database clock), oldest lease first,
the first matching rule wins:

1. ``fence`` — a ``non_idempotent_write`` was in flight → ``waiting_for_reconciliation``. Never
   retried automatically, whatever the budget: the side effect may have landed.
2. ``not_rehydratable`` — the stored state cannot be turned back into a dialogue → settle
   ``failed`` / ``not_resumable``.
3. ``budget`` — ``requeue_count >= MAX_REQUEUES`` → settle ``failed`` / ``retries_exhausted``.
4. ``reclaim`` — back to ``queued`` (budget + 1) and, after commit, a wake-up; a worker continues
   from the last step boundary. A wake-up that cannot be sent settles the run ``failed`` /
   ``not_retryable`` instead of leaving it queued with nothing to wake it.

Runs are taken in batches, each one transaction under ``SELECT … FOR UPDATE SKIP LOCKED`` (so two
reapers never handle one run; on SQLite the IMMEDIATE transaction serialises them instead), and
carried out set-based (``transitions.runs_reap_stale``: one guarded ``UPDATE`` per verdict kind
that re-checks staleness row by row, one INSERT of the events): a holder that renewed its lease
meanwhile keeps its run (verdict ``skipped``). Every verdict is a ``reaper`` event; a run parked
in doubt whose tool declares a check gets the check task once the batch commits (§9.2). Then
queued runs nobody claimed for ``REDISPATCH_SECONDS`` get a fresh wake-up, and in-doubt runs
whose tool's check stalled (its task lost, or its worker died) get the check task again
(``reconciliation.redispatch_due``). Runs waiting for approval or input past their approval deadline
are settled too (rule ``deadline``: denied or failed, ``services.deadline_sweep``, §5.11), and the
budget holds past their expiry lapse (``budgets.lapse_holds``, §14).

Owns no state of its own and never executes a run: it only settles or hands runs back.

This module is the pass (``reap_stale_runs``: batches, then deadlines, then redispatch); its
parts are ``rules`` (the rules and ``rule_for``), ``batches`` (carrying a batch's verdicts out),
``wakeups`` (wake-ups and the redispatch of unclaimed runs) and ``report`` (the verdicts and the
report). The names in ``__all__`` are its public surface.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Prefetch, prefetch_related_objects

from agentruns import budgets, selectors, tracing
from agentruns.identity import reaper_identity
from agentruns.metrics import record_reaper_pass
from agentruns.models import AgentRun, AgentRunEvent
from agentruns.services import deadline_sweep, reconciliation
from agentruns.services.reaper.batches import _apply_batch
from agentruns.services.reaper.report import (
    ReaperReport,
    RunVerdict,
    _deadline_verdict,
    _verdict,
)
from agentruns.services.reaper.rules import (
    JUDGE_CHUNK,
    REPLAY_EVENTS,
    RESULT,
    VERDICT_OF_RULE,
    Rule,
    Verdict,
    rule_for,
)
from agentruns.services.reaper.wakeups import (
    REDISPATCH_LIMIT,
    _send_wakeups,
    _settle_unsent,
    redispatch_unclaimed,
)
from agentruns.turns import PendingTurn

logger = logging.getLogger(__name__)

__all__ = [
    "BATCH_SIZE",
    "JUDGE_CHUNK",
    "REDISPATCH_LIMIT",
    "REPLAY_EVENTS",
    "RESULT",
    "VERDICT_OF_RULE",
    "ReaperReport",
    "Rule",
    "RunVerdict",
    "Verdict",
    "reap_stale_runs",
    "redispatch_unclaimed",
    "rule_for",
]

#: Runs locked per transaction. Small enough that a pass never holds many row locks for long.
BATCH_SIZE = 200


def _judge_all(runs: list[AgentRun]) -> list[tuple[AgentRun, str, str]]:
    """Each run with its rule and detail (``rule_for``, looked up in this module: a test may
    replace it here). The events the rules replay are read for ``JUDGE_CHUNK`` runs at a time
    (one query each) and dropped once they are judged."""
    judged: list[tuple[AgentRun, str, str]] = []
    replay = Prefetch(
        "events",
        queryset=AgentRunEvent.objects.order_by("sequence").only(
            "run_id", "sequence", "kind", "payload"
        ),
        to_attr=REPLAY_EVENTS,
    )
    for start in range(0, len(runs), JUDGE_CHUNK):
        chunk = runs[start : start + JUDGE_CHUNK]
        prefetch_related_objects(chunk, replay)
        for run in chunk:
            judged.append((run, *rule_for(run)))
            delattr(run, REPLAY_EVENTS)
    return judged


def _batch(
    *, size: int, after: tuple[Any, int] | None, identity: str, dry_run: bool
) -> tuple[list[RunVerdict], tuple[Any, int] | None]:
    """Judge one batch and carry it out in one transaction; send the wake-ups once it
    committed."""
    with transaction.atomic():
        queryset = selectors.stale_runs(after=after)
        if not dry_run:
            queryset = queryset.select_for_update(skip_locked=True, of=("self",))
        runs = list(queryset[:size])
        judged = _judge_all(runs)
        failures: dict[int, str] = {}
        if dry_run:
            taken = {run.pk for run in runs}
        else:
            taken, failures = _apply_batch(judged, identity)
    verdicts = [
        _verdict(run, rule, detail, taken=run.pk in taken, failure=failures.get(run.pk, ""))
        for run, rule, detail in judged
    ]
    reclaimed = [
        (run, position)
        for position, (run, verdict) in enumerate(zip(runs, verdicts, strict=True))
        if verdict.verdict == Verdict.REQUEUED and not dry_run
    ]
    unsent = _send_wakeups([run for run, _ in reclaimed]) if reclaimed else {}
    for run, position in reclaimed:
        if run.pk in unsent:
            verdicts[position] = _settle_unsent(run, verdicts[position], unsent[run.pk], identity)
    if not dry_run:
        _traced(runs, verdicts)
    cursor = (runs[-1].lease_expires, runs[-1].pk) if runs else after
    return verdicts, cursor


def _traced(runs: list[AgentRun], verdicts: list[RunVerdict]) -> None:
    """Each verdict's span in its run's trace (``tracing.reaper_verdict``), and the in-doubt
    span of each run it parked (the stale lease's fence)."""
    if not tracing.enabled():
        return
    for run, verdict in zip(runs, verdicts, strict=True):
        tracing.reaper_verdict(
            run, rule=verdict.rule, verdict=verdict.verdict, result=verdict.result
        )
        if verdict.verdict == Verdict.IN_DOUBT:
            call = PendingTurn.for_reconciliation(run).call
            tracing.in_doubt(run, by="reaper", call_name=call.name if call is not None else "")


def _lapse_holds() -> int:
    """The budget holds past their expiry, charged at what they held (``budgets.lapse_holds``).
    A database error is logged: the pass has done its work on the runs."""
    try:
        return budgets.lapse_holds()
    except DatabaseError:
        logger.exception("could not lapse the expired budget holds")
        return 0


def reap_stale_runs(
    *,
    limit: int | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    redispatch: bool = True,
) -> ReaperReport:
    """One reaper pass: a verdict for up to ``limit`` stale runs (all when ``None``), then the
    redispatch of unclaimed queued runs. ``dry_run`` judges and changes nothing.

    Safe to run concurrently with itself and with live segments. Call it outside a transaction:
    the wake-ups are sent after each batch commits.
    """
    if limit is not None and limit < 1:
        raise ValueError("limit must be a positive integer")
    if batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    identity = reaper_identity()
    report = ReaperReport(dry_run=dry_run)
    cursor: tuple[Any, int] | None = None
    while limit is None or report.found < limit:
        size = batch_size if limit is None else min(batch_size, limit - report.found)
        verdicts, cursor = _batch(size=size, after=cursor, identity=identity, dry_run=dry_run)
        report.verdicts.extend(verdicts)
        if len(verdicts) < size:
            break
    report.expired = [
        _deadline_verdict(outcome)
        for outcome in deadline_sweep.expire_overdue(
            identity=identity, limit=limit, dry_run=dry_run
        )
    ]
    if not dry_run:
        report.holds_lapsed = _lapse_holds()
    if redispatch and not dry_run:
        report.redispatched = redispatch_unclaimed(identity=identity)
        report.checks_redispatched = reconciliation.redispatch_due()
    record_reaper_pass(report)
    return report
