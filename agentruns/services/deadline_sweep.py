"""Approval deadlines, the reaper's part (docs/design.md §5.11): settle the runs that waited for
approval or input past their deadline.

Each overdue run (``selectors.overdue_waiting_runs``, earliest deadline first) is settled by its
own guarded transition (``transitions.run_expire_waiting``: its row lock taken ``SKIP LOCKED``,
status and deadline re-checked), then — denied, so ``queued`` — woken through the queue once
that committed. A wake-up that cannot be sent is logged: the run is queued, and the reaper's
redispatch sends a fresh one to queued runs nobody claimed. A run escalated instead (it keeps
waiting, with a second deadline) gets the task that tells the escalation group at once
(``tasks.notify_escalated``); one that cannot be sent is logged, and the next digest tells them.

Owns no state and never executes a run; a run waiting for reconciliation is never touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from agentruns import selectors, tracing, transitions
from agentruns.exceptions import StateWriteFailed
from agentruns.models import AgentConfiguration, AgentRun, ApprovalTimeoutAction, Status
from agentruns.services import dispatch
from agentruns.transitions.escalation import escalation_plan

logger = logging.getLogger(__name__)

#: The task telling an escalation group at once (``agentruns.tasks.notify_escalated``).
NOTIFY_ESCALATED_TASK = "agentruns.tasks.notify_escalated"
#: At most this many overdue runs are settled per pass (the next pass takes the rest).
EXPIRE_LIMIT = 500


@dataclass(frozen=True)
class DeadlineOutcome:
    """What a pass did (or, in a dry run, would do) to one overdue run."""

    run_uuid: UUID
    waited: str  # the status it waited in
    action: str  # deny, fail or escalate ("" when skipped)
    deadline: datetime | None
    taken: bool
    failure: str = ""

    @property
    def result(self) -> str:
        if not self.taken:
            return ""
        if self.action == ApprovalTimeoutAction.DENY:
            return Status.QUEUED.value
        if self.action == ApprovalTimeoutAction.ESCALATE:
            return f"{self.waited} (escalated)"
        return f"{Status.FAILED.value}/approval_expired"


def expire_overdue(
    *, identity: str, limit: int | None = None, dry_run: bool = False
) -> list[DeadlineOutcome]:
    """Settle up to ``limit`` (default ``EXPIRE_LIMIT``) runs past their approval deadline.

    ``dry_run``: say what would happen, change nothing. Call it outside a transaction (each
    settle is its own; the wake-up is sent after it commits).
    """
    overdue = selectors.overdue_waiting_runs().only(
        "pk",
        "uuid",
        "status",
        "approval_deadline",
        "approval_timeout_action",
        "configuration",
        "config_version",
        *tracing.RUN_FIELDS,
    )[: limit or EXPIRE_LIMIT]
    outcomes: list[DeadlineOutcome] = []
    for run in list(overdue):
        if dry_run:
            outcomes.append(
                DeadlineOutcome(
                    run.uuid, run.status, _planned(run), run.approval_deadline, taken=True
                )
            )
            continue
        try:
            expired = transitions.run_expire_waiting(run_id=run.pk, segment=identity)
        except StateWriteFailed as exc:
            logger.exception("reaper: could not settle the overdue run %s", run.uuid)
            outcomes.append(
                DeadlineOutcome(
                    run.uuid,
                    run.status,
                    "",
                    run.approval_deadline,
                    taken=False,
                    failure=f"state write failed: {exc.message}",
                )
            )
            continue
        if expired is None:  # decided, cancelled or being decided meanwhile
            outcomes.append(
                DeadlineOutcome(run.uuid, run.status, "", run.approval_deadline, taken=False)
            )
            continue
        payload = {"by": "deadline", "verdict": str(expired.action)}
        tracing.decision(run, kind="deadline", payload=payload, actor_id=None)
        if expired.action == ApprovalTimeoutAction.DENY:
            dispatch.wake_after_commit(str(expired.run_uuid))  # committed: sent at once
        elif expired.action == ApprovalTimeoutAction.ESCALATE:
            _notify_escalated(expired.run_uuid)
        outcomes.append(
            DeadlineOutcome(
                expired.run_uuid, expired.waited, expired.action, expired.deadline, taken=True
            )
        )
    return outcomes


def _planned(run: AgentRun) -> str:
    """What the settle would do to ``run`` (a dry run): as ``run_expire_waiting`` decides it."""
    if run.approval_timeout_action == ApprovalTimeoutAction.ESCALATE:
        plan = escalation_plan(run)
        return ApprovalTimeoutAction.ESCALATE if plan.possible else plan.fallback
    active = AgentConfiguration.objects.filter(pk=run.configuration_id, is_active=True).exists()
    if run.approval_timeout_action == ApprovalTimeoutAction.DENY and active:
        return ApprovalTimeoutAction.DENY
    return ApprovalTimeoutAction.FAIL


def _notify_escalated(run_uuid: UUID) -> None:
    """Send the task that tells the escalation group (committed: sent at once). A failure is
    logged; the run's next digest tells them instead."""
    from django_q.tasks import async_task

    try:
        async_task(NOTIFY_ESCALATED_TASK, str(run_uuid))
    except Exception:  # the broker refused: the digest covers it
        logger.exception("reaper: could not send the escalation notice of run %s", run_uuid)
