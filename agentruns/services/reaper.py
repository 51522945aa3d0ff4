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
(``checks.redispatch_due``). Runs waiting for approval or input past their approval deadline
are settled too (rule ``deadline``: denied or failed, ``services.deadlines``, §5.11).

Owns no state of its own and never executes a run: it only settles or hands runs back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Prefetch, prefetch_related_objects

from agentruns import conf, selectors, transitions
from agentruns.exceptions import StateWriteFailed
from agentruns.identity import reaper_identity
from agentruns.leases import EventSpec
from agentruns.metrics import record_reaper_pass
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status, TerminationReason
from agentruns.services import checks, deadlines, dispatch
from agentruns.services.runtime.transcript import NotRehydratable, rehydrate
from agentruns.tools import registry
from agentruns.turns import CheckStatus, PendingTurn

logger = logging.getLogger(__name__)

#: Runs locked per transaction. Small enough that a pass never holds many row locks for long.
BATCH_SIZE = 200
#: Runs whose events are read together to judge them (bounds the transcripts held at once).
JUDGE_CHUNK = 50
#: Where ``_judge_all`` puts a run's prefetched events for ``rule_for``.
REPLAY_EVENTS = "replay_events"
#: At most this many unclaimed queued runs get a fresh wake-up per pass.
REDISPATCH_LIMIT = 500


class Rule:
    FENCE = "fence"
    NOT_REHYDRATABLE = "not_rehydratable"
    BUDGET = "budget"
    RECLAIM = "reclaim"
    DEADLINE = "deadline"  # a run waited for approval or input past its deadline (§5.11)


class Verdict:
    IN_DOUBT = "in_doubt"
    DEAD_LETTERED = "dead_lettered"
    REQUEUED = "requeued"
    SKIPPED = "skipped"
    DENIED = "denied"  # denied on behalf of the deadline, queued to continue


#: What each verdict leaves the run as (shown by the command).
RESULT = {
    Rule.FENCE: Status.WAITING_FOR_RECONCILIATION.value,
    Rule.NOT_REHYDRATABLE: f"{Status.FAILED.value}/{TerminationReason.NOT_RESUMABLE.value}",
    Rule.BUDGET: f"{Status.FAILED.value}/{TerminationReason.RETRIES_EXHAUSTED.value}",
    Rule.RECLAIM: Status.QUEUED.value,
}
VERDICT_OF_RULE = {
    Rule.FENCE: Verdict.IN_DOUBT,
    Rule.NOT_REHYDRATABLE: Verdict.DEAD_LETTERED,
    Rule.BUDGET: Verdict.DEAD_LETTERED,
    Rule.RECLAIM: Verdict.REQUEUED,
}


@dataclass(frozen=True)
class RunVerdict:
    """The reaper's verdict on one stale run."""

    run_uuid: UUID
    segment: str  # the claimed_by that abandoned it
    lease_epoch: int
    rule: str
    verdict: str
    result: str  # the status (and reason) it was left in; "" when skipped
    detail: str = ""

    def line(self) -> str:
        text = (
            f"{self.run_uuid} segment={self.segment or '-'} rule={self.rule} verdict={self.verdict}"
        )
        if self.result:
            text += f" -> {self.result}"
        if self.detail:
            text += f" ({self.detail})"
        return text


@dataclass
class ReaperReport:
    """One pass: a verdict per stale run found, and how many queued runs were redispatched."""

    dry_run: bool = False
    verdicts: list[RunVerdict] = field(default_factory=list)
    redispatched: int = 0
    checks_redispatched: int = 0  # check tasks of in-doubt runs sent again (docs/design.md §9.2)
    # Runs that waited for approval or input past their deadline (docs/design.md §5.11).
    expired: list[RunVerdict] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def found(self) -> int:
        return len(self.verdicts)

    def summary(self) -> str:
        text = (
            f"found {self.found}, requeued {self.count(Verdict.REQUEUED)}, "
            f"in doubt {self.count(Verdict.IN_DOUBT)}, "
            f"dead-lettered {self.count(Verdict.DEAD_LETTERED)}, "
            f"skipped {self.count(Verdict.SKIPPED)}"
        )
        if self.expired:
            denied = sum(1 for v in self.expired if v.verdict == Verdict.DENIED)
            failed = sum(1 for v in self.expired if v.verdict == Verdict.DEAD_LETTERED)
            text += (
                f"; past their approval deadline {len(self.expired)}: denied {denied}, "
                f"failed {failed}, skipped {len(self.expired) - denied - failed}"
            )
        if self.dry_run:
            return text + " (dry run: nothing changed)"
        text += f"; redispatched {self.redispatched} unclaimed queued run(s)"
        if self.checks_redispatched:
            text += f", {self.checks_redispatched} lost check(s) of in-doubt runs"
        return text


def rule_for(run: AgentRun) -> tuple[str, str]:
    """The first rule of docs/design.md §8.2 that matches ``run`` and a detail for the record.

    Replays the events a batch prefetched into ``run.<REPLAY_EVENTS>`` (``_judge_all``), else
    reads them.
    """
    if run.pending_effect == Effect.NON_IDEMPOTENT_WRITE:
        call = PendingTurn.for_reconciliation(run).call
        return Rule.FENCE, f"{call.name if call and call.name else 'unknown call'} in flight"
    try:
        rehydrate(run, getattr(run, REPLAY_EVENTS, None))
    except NotRehydratable as exc:
        return Rule.NOT_REHYDRATABLE, str(exc)[:200]
    budget = int(conf.get("MAX_REQUEUES"))
    if run.requeue_count >= budget:
        return Rule.BUDGET, f"{run.requeue_count} of {budget} retries used"
    return Rule.RECLAIM, ""


def _judge_all(runs: list[AgentRun]) -> list[tuple[AgentRun, str, str]]:
    """Each run with its rule and detail (``rule_for``). The events the rules replay are read
    for ``JUDGE_CHUNK`` runs at a time (one query each) and dropped once they are judged."""
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


def _verdict(run: AgentRun, rule: str, detail: str, *, taken: bool, failure: str) -> RunVerdict:
    """The verdict on ``run`` once its ``rule`` was carried out (``taken``) or not."""
    verdict = VERDICT_OF_RULE[rule]
    if failure:
        detail = failure
    if not taken:
        verdict, detail = Verdict.SKIPPED, detail or "lease renewed or run changed meanwhile"
    return RunVerdict(
        run_uuid=run.uuid,
        segment=run.claimed_by,
        lease_epoch=run.lease_epoch,
        rule=rule,
        verdict=verdict,
        result=RESULT[rule] if verdict != Verdict.SKIPPED else "",
        detail=detail,
    )


def _send_wakeups(runs: list[AgentRun]) -> dict[int, str]:
    """Send the wake-ups of a committed batch; the error text of each one that failed.

    One transaction for the batch (with the ORM broker, ``dispatch.batched_wakeups`` writes the
    task rows in one INSERT). Should a send fail, that transaction is rolled back and the batch
    is sent again with a savepoint per send, so one failure does not undo the others (a wake-up
    that a non-transactional broker had already sent is then sent twice: claims decide, so the
    duplicate is harmless). If the commit itself fails, none was sent.
    """
    try:
        with transaction.atomic(), dispatch.batched_wakeups():
            for run in runs:
                dispatch.send_wakeup(str(run.uuid))
        return {}
    except Exception:
        logger.warning("reaper: a wake-up failed; sending the batch's one by one", exc_info=True)
    failures: dict[int, str] = {}
    try:
        with transaction.atomic():
            for run in runs:
                try:
                    with transaction.atomic():
                        dispatch.send_wakeup(str(run.uuid))
                except Exception as exc:
                    logger.exception("reaper: could not send the wake-up for run %s", run.uuid)
                    failures[run.pk] = f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:
        logger.exception("reaper: the batch of wake-ups could not be committed")
        failures = {run.pk: f"{type(exc).__name__}: {exc}"[:500] for run in runs}
    return failures


def _settle_unsent(run: AgentRun, verdict: RunVerdict, message: str, identity: str) -> RunVerdict:
    """A reclaimed run whose wake-up was not sent: settle it rather than leave it queued."""
    error = {"type": "DispatchFailed", "message": message}
    settled = transitions.run_settle_undispatched(
        run_id=run.pk,
        lease_epoch=run.lease_epoch,
        error=error,
        segment=identity,
        event=EventSpec(
            EventKind.REAPER,
            {
                "rule": Rule.RECLAIM,
                "verdict": Verdict.DEAD_LETTERED,
                "detail": "the wake-up could not be sent",
                "error": error,
            },
        ),
    )
    if not settled:  # a worker claimed it meanwhile (a duplicate task): it is not orphaned
        return verdict
    return RunVerdict(
        run_uuid=verdict.run_uuid,
        segment=verdict.segment,
        lease_epoch=verdict.lease_epoch,
        rule=Rule.RECLAIM,
        verdict=Verdict.DEAD_LETTERED,
        result=f"{Status.FAILED.value}/{TerminationReason.NOT_RETRYABLE.value}",
        detail="wake-up not sent: " + message,
    )


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
    cursor = (runs[-1].lease_expires, runs[-1].pk) if runs else after
    return verdicts, cursor


def _deadline_verdict(outcome: deadlines.DeadlineOutcome) -> RunVerdict:
    """The line and the counted verdict of one run past its approval deadline."""
    deadline = outcome.deadline.isoformat() if outcome.deadline else "?"
    if outcome.taken:
        verdict = Verdict.DENIED if outcome.action == "deny" else Verdict.DEAD_LETTERED
        detail = f"waited in {outcome.waited} past its deadline {deadline}"
    else:
        verdict = Verdict.SKIPPED
        detail = outcome.failure or "decided, cancelled or being decided meanwhile"
    return RunVerdict(
        run_uuid=outcome.run_uuid,
        segment="",
        lease_epoch=0,
        rule=Rule.DEADLINE,
        verdict=verdict,
        result=outcome.result,
        detail=detail,
    )


def redispatch_unclaimed(*, identity: str | None = None, limit: int = REDISPATCH_LIMIT) -> int:
    """Send a fresh wake-up to queued runs nobody claimed for ``REDISPATCH_SECONDS``.

    Claims decide, so a duplicate is harmless; each run is redispatched at most once per period
    (the guarded mark bumps ``updated_at``). Returns how many wake-ups were sent.
    """
    identity = identity or reaper_identity()
    seconds = float(conf.get("REDISPATCH_SECONDS"))
    candidates = selectors.unclaimed_queued_runs(older_than_seconds=seconds).values_list(
        "pk", "uuid"
    )[:limit]
    sent = 0
    for run_id, run_uuid in list(candidates):
        marked = transitions.run_mark_redispatched(
            run_id=run_id,
            older_than_seconds=seconds,
            segment=identity,
            event=EventSpec(
                EventKind.REAPER,
                {"rule": "redispatch", "verdict": "redispatched", "unclaimed_for_s": seconds},
            ),
        )
        if not marked:
            continue
        try:
            with transaction.atomic():
                dispatch.send_wakeup(str(run_uuid))
        except Exception:
            logger.exception("reaper: could not redispatch run %s; next pass retries", run_uuid)
            continue
        sent += 1
    return sent


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
        for outcome in deadlines.expire_overdue(identity=identity, limit=limit, dry_run=dry_run)
    ]
    if redispatch and not dry_run:
        report.redispatched = redispatch_unclaimed(identity=identity)
        report.checks_redispatched = checks.redispatch_due()
    record_reaper_pass(report)
    return report
