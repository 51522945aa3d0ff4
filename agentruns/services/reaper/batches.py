"""Carrying out a locked batch's verdicts (docs/design.md §8.1): set-based through
``transitions.runs_reap_stale`` (one guarded ``UPDATE`` per verdict kind, one INSERT of the
events), or, should the database refuse that, run by run, each transition in its own savepoint.

Runs inside the batch's transaction; the only thing deferred is an in-doubt run's check task,
sent after commit (§9.2).
"""

from __future__ import annotations

import logging

from agentruns import transitions
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.services import dispatch
from agentruns.services.reaper.rules import VERDICT_OF_RULE, Rule
from agentruns.tools import registry
from agentruns.turns import CheckStatus, PendingTurn

# The reaper's one logger, named as before the package was split.
logger = logging.getLogger("agentruns.services.reaper")


def _event(run: AgentRun, rule: str, verdict: str, detail: str) -> EventSpec:
    return EventSpec(
        EventKind.REAPER,
        {
            "rule": rule,
            "verdict": verdict,
            "detail": detail,
            "abandoned_by": run.claimed_by,
            "lease_epoch": run.lease_epoch,
            "lease_expired_at": run.lease_expires.isoformat() if run.lease_expires else None,
            "requeue_count": run.requeue_count,
            "pending_effect": run.pending_effect,
        },
    )


def _settlement(rule: str, detail: str) -> tuple[str, dict[str, str]]:
    """The termination reason and error of a dead-lettering ``rule``."""
    reason, error_type = (
        (TerminationReason.NOT_RESUMABLE, "NotRehydratable")
        if rule == Rule.NOT_REHYDRATABLE
        else (TerminationReason.RETRIES_EXHAUSTED, "RetriesExhausted")
    )
    return reason, {"type": error_type, "message": f"stale lease: {detail}"}


def _initial_check(run: AgentRun) -> CheckStatus | None:
    """The check state an in-doubt turn starts with: queued when the fenced call's tool
    declares a check (``dispatch.initial_check``), else none (a person decides)."""
    call = PendingTurn.for_reconciliation(run).call
    return dispatch.initial_check(registry.get(call.name) if call and call.name else None)


def _apply(run: AgentRun, rule: str, detail: str, identity: str) -> bool:
    """Carry out ``rule`` on ``run`` through its guarded transition; ``False``: not stale now."""
    event = _event(run, rule, VERDICT_OF_RULE[rule], detail)
    if rule == Rule.FENCE:
        check = _initial_check(run)
        parked = transitions.run_mark_in_doubt(
            run_id=run.pk,
            pending_turn=PendingTurn.for_reconciliation(run, check=check),
            segment=identity,
            event=event,
        )
        if parked and check is not None:
            # After the batch commits: the call's tool checks whether it landed (§9.2).
            dispatch.check_after_commit(str(run.uuid))
        return parked
    if rule == Rule.RECLAIM:
        return transitions.run_reclaim_stale(run_id=run.pk, segment=identity, event=event)
    reason, error = _settlement(rule, detail)
    return transitions.run_settle(
        run_id=run.pk,
        status=Status.FAILED,
        reason=reason,
        stale_only=True,
        error=error,
        events=[event],
        segment=identity,
    )


def _apply_batch(
    judged: list[tuple[AgentRun, str, str]], identity: str
) -> tuple[set[int], dict[int, str]]:
    """Carry out a locked batch's rules: the pks of the runs changed, and the error text of each
    run whose write the database refused.

    Set-based (``runs_reap_stale``: one guarded ``UPDATE`` per verdict kind, one INSERT of the
    events). Should the database refuse that, nothing of it stays and the batch is carried out
    run by run, each transition in its own savepoint, so a bad row costs only its own verdict.
    """
    in_doubt: dict[int, PendingTurn] = {}
    dead_lettered: dict[int, tuple[str, dict[str, str]]] = {}
    reclaim: list[int] = []
    events: dict[int, EventSpec] = {}
    checked: dict[int, str] = {}  # in-doubt runs whose tool declares a check: their uuids
    for run, rule, detail in judged:
        events[run.pk] = _event(run, rule, VERDICT_OF_RULE[rule], detail)
        if rule == Rule.FENCE:
            check = _initial_check(run)
            in_doubt[run.pk] = PendingTurn.for_reconciliation(run, check=check)
            if check is not None:
                checked[run.pk] = str(run.uuid)
        elif rule == Rule.RECLAIM:
            reclaim.append(run.pk)
        else:
            dead_lettered[run.pk] = _settlement(rule, detail)
    try:
        taken = transitions.runs_reap_stale(
            in_doubt=in_doubt,
            dead_lettered=dead_lettered,
            reclaim=reclaim,
            events=events,
            segment=identity,
        )
        for run_id in taken & checked.keys():
            # After the batch commits: the call's tool checks whether it landed (§9.2).
            dispatch.check_after_commit(checked[run_id])
        return taken, {}
    except StateWriteFailed:
        logger.exception("reaper: the batch write failed; carrying the batch out run by run")
    taken, failures = set(), {}
    for run, rule, detail in judged:
        try:
            if _apply(run, rule, detail, identity):
                taken.add(run.pk)
        except StateWriteFailed as exc:
            failures[run.pk] = f"state write failed: {exc.message}"
    return taken, failures
