"""The reaper's rules (docs/design.md §8.2): the vocabulary of rules and verdicts, what each
leaves a run as, and ``rule_for``, the first rule that matches a stale run.

Reads only (the run and, when a batch did not prefetch them, its events); writes nothing.
"""

from __future__ import annotations

from agentruns.conf import app_settings
from agentruns.models import AgentRun, Effect, Status, TerminationReason
from agentruns.services.runtime.transcript import NotRehydratable, rehydrate
from agentruns.turns import PendingTurn

#: Runs whose events are read together to judge them (bounds the transcripts held at once).
JUDGE_CHUNK = 50
#: Where ``_judge_all`` puts a run's prefetched events for ``rule_for``.
REPLAY_EVENTS = "replay_events"


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
    ESCALATED = "escalated"  # handed to the escalation group, with a second deadline


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
    budget = app_settings().max_requeues
    if run.requeue_count >= budget:
        return Rule.BUDGET, f"{run.requeue_count} of {budget} retries used"
    return Rule.RECLAIM, ""
