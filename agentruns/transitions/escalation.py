"""Escalation (docs/design.md §5.11): a wait whose configuration says ``escalate`` is not ended
at its deadline but handed to the configuration's ``escalation_group``, with a second deadline
(``escalation_timeout``) after which its final action (``on_escalation_timeout``: deny or fail)
applies.

``escalation_plan`` reads what the configuration says now; ``escalate_locked`` writes the hand-
over for a run ``transitions.deadlines.run_expire_waiting`` read under its row lock, in the same
transaction and under the same guard as the deadline's other settles: one ``UPDATE`` moves the
deadline (``Now() + escalation_timeout``, database clock), sets the action to the final one and
records who it went to and when (``escalated_to``, ``escalated_at``), with one ``escalation``
event chained like every event. The run keeps waiting, its turn and digest unchanged: a person's
decision taken before the hand-over wins (the run no longer waits when the reaper locks it); one
refused past the first deadline changed nothing; one after it decides as usual. The final action
is then settled by the deadline exactly as an unescalated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agentruns.leases import EventSpec
from agentruns.models import (
    FINAL_TIMEOUT_ACTIONS,
    AgentConfiguration,
    AgentRun,
    ApprovalTimeoutAction,
    EventKind,
)
from agentruns.models.configuration import MAX_APPROVAL_TIMEOUT
from agentruns.transitions._writer import locked_write
from agentruns.turns import DEADLINE
from agentruns.versions import UnreadableVersion, pinned_values


@dataclass(frozen=True)
class EscalationPlan:
    """What the run's configuration says about escalating, read under the run's lock.

    ``possible``: active, a group and a positive second deadline — else the deadline applies
    ``final`` at once (``fail`` when the configuration was deactivated: nobody should continue
    the run)."""

    active: bool
    group_id: int | None
    group_name: str
    timeout: timedelta | None
    final: str

    @property
    def possible(self) -> bool:
        return (
            self.active
            and self.group_id is not None
            and self.timeout is not None
            and timedelta(0) < self.timeout
        )

    @property
    def fallback(self) -> str:
        """The action when escalating is not possible."""
        return self.final if self.active else ApprovalTimeoutAction.FAIL


def escalation_plan(run: AgentRun) -> EscalationPlan:
    """The escalation ``run``'s configuration asks for: whether it is active and its group read
    afresh (one query), the second deadline and its action from the version ``run`` pinned."""
    row = (
        AgentConfiguration.objects.filter(pk=run.configuration_id)
        .values(
            "is_active",
            "escalation_group_id",
            "escalation_group__name",
        )
        .first()
    )
    if row is None:  # pragma: no cover - a configuration is PROTECTed while it has runs
        return EscalationPlan(False, None, "", None, ApprovalTimeoutAction.FAIL)
    # The second deadline and its action are the run's pinned version's (the group is live:
    # people, not versions).
    try:
        pinned = pinned_values(run.config_version_id).values
    except UnreadableVersion:  # fail closed: nobody knows what the run was to do
        return EscalationPlan(False, None, "", None, ApprovalTimeoutAction.FAIL)
    final = pinned["on_escalation_timeout"]
    timeout = pinned["escalation_timeout"]
    return EscalationPlan(
        active=bool(row["is_active"]),
        group_id=row["escalation_group_id"],
        group_name=row["escalation_group__name"] or "",
        timeout=min(timeout, MAX_APPROVAL_TIMEOUT) if timeout is not None else None,
        final=final if final in FINAL_TIMEOUT_ACTIONS else ApprovalTimeoutAction.FAIL,
    )


def escalation_event(run: AgentRun, plan: EscalationPlan, digest: str) -> EventSpec:
    """The ``escalation`` event of handing ``run``'s wait over (``plan.possible``)."""
    assert plan.timeout is not None
    return EventSpec(
        EventKind.ESCALATION,
        {
            "turn_digest": digest,
            "by": DEADLINE,
            "waited": run.status,
            "deadline": run.approval_deadline.isoformat() if run.approval_deadline else None,
            "group": plan.group_name,
            "group_id": plan.group_id,
            "timeout_seconds": plan.timeout.total_seconds(),
            "then": plan.final,
        },
    )


def escalate_locked(
    run: AgentRun, plan: EscalationPlan, event: EventSpec, *, segment: str
) -> AgentRun | None:
    """Hand ``run`` (read under its row lock, inside the caller's transaction) to ``plan``'s
    group: the statement ``escalate`` (guard: still waiting in the status read, overdue, and its
    action ``escalate``) and its event. ``None``: the guard matched nothing (impossible under
    the lock)."""
    assert plan.possible and plan.timeout is not None
    params: dict[str, Any] = {
        "status": run.status,
        "wait_seconds": plan.timeout.total_seconds(),
        "approval_timeout_action": plan.final,
        "escalated_to_id": plan.group_id,
    }
    return locked_write(run, "escalate", params, [event], signer=(segment, run.lease_epoch))
