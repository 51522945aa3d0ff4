"""Approval deadlines (docs/design.md §5.11): fixing a waiting run's deadline when it suspends,
and settling it once the deadline passed.

* ``WaitDeadline`` — what a configuration says about waiting, which ``run_suspend`` writes in
  its own ``UPDATE``: the run never waits without the deadline its configuration gave it when
  it started waiting.
* ``run_expire_waiting`` — the reaper's settle of one overdue run, under its row lock (``SKIP
  LOCKED``): deny on behalf of the deadline (``queued``, the denial in the loop state), fail
  (``failed`` / ``approval_expired``) or escalate (``transitions.escalation``: a second
  deadline, the wait handed to the escalation group), with its event, chained like every event.
* ``past_deadline`` — a person's decision checks it under the row lock: once the deadline passed
  by the database clock, the run is the deadline's to settle.

A run waiting for reconciliation (an in-doubt write) is never subject to a deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from agentruns.leases import EventSpec
from agentruns.models import (
    DEADLINE_STATUSES,
    AgentConfiguration,
    AgentRun,
    ApprovalTimeoutAction,
    EventKind,
    Status,
)
from agentruns.models.configuration import MAX_APPROVAL_TIMEOUT
from agentruns.transitions._writer import locked_write, state_write
from agentruns.transitions.escalation import escalate_locked, escalation_event, escalation_plan
from agentruns.turns import (
    DEADLINE,
    INPUT,
    ApprovalDecision,
    PendingTurn,
    read_pending_turn,
    stored_digest,
    with_decision,
)


@dataclass(frozen=True)
class WaitDeadline:
    """What a configuration says about waiting, read when the run suspends: how long it may
    wait (``None``: no deadline) and what happens then."""

    timeout: timedelta | None
    action: str = ApprovalTimeoutAction.DENY

    @classmethod
    def of(cls, configuration: AgentConfiguration) -> WaitDeadline:
        timeout = configuration.approval_timeout
        if timeout is not None and timeout <= timedelta(0):
            timeout = None  # refused by the admin; a row written around it means no deadline
        elif timeout is not None and timeout > MAX_APPROVAL_TIMEOUT:
            timeout = MAX_APPROVAL_TIMEOUT  # likewise: never a timestamp the column cannot hold
        action = configuration.on_approval_timeout
        if action not in ApprovalTimeoutAction.values:
            action = ApprovalTimeoutAction.FAIL  # unknown: the safe ending
        return cls(timeout=timeout, action=str(action))


def past_deadline(run: AgentRun) -> bool:
    """Whether ``run`` (read under its row lock) waits for approval or input past its deadline,
    by the database clock. A person's decision is refused then (``ApprovalExpired``): the
    deadline settles it."""
    if run.status not in DEADLINE_STATUSES or run.approval_deadline is None:
        return False
    return AgentRun.objects.filter(pk=run.pk, approval_deadline__lt=Now()).exists()


@dataclass(frozen=True)
class Expired:
    """One run the deadline settled: how it waited, what it got, and the event written."""

    run_id: int
    run_uuid: UUID
    waited: str  # the status it waited in
    action: str  # deny or fail
    deadline: datetime | None
    event: EventSpec


def _overdue() -> Q:
    return Q(status__in=list(DEADLINE_STATUSES), approval_deadline__lt=Now())


def _event(run: AgentRun, pending: PendingTurn, action: str, digest: str) -> EventSpec:
    deadline = run.approval_deadline.isoformat() if run.approval_deadline else None
    common = {
        "turn_digest": digest,
        "by": DEADLINE,
        "decider": DEADLINE,
        "deadline": deadline,
        "action": action,
    }
    if pending.kind == INPUT or run.status == Status.WAITING_FOR_INPUT:
        call = pending.call
        return EventSpec(
            EventKind.INPUT,
            {
                "call_id": call.id if call else "",
                "name": call.name if call else "",
                "values": None,
                "expired": True,
                **common,
            },
        )
    return EventSpec(
        EventKind.APPROVAL,
        {
            "approved": False,
            "calls": [{"id": c.id, "name": c.name} for c in pending.calls],
            **common,
        },
    )


@state_write
def run_expire_waiting(*, run_id: int, segment: str) -> Expired | None:
    """Settle a run whose approval deadline passed, in one transaction under its row lock.

    Guard: ``waiting_for_approval`` or ``waiting_for_input`` and ``approval_deadline <
    Now()`` — read with ``SELECT … FOR UPDATE SKIP LOCKED`` (a person deciding holds the row:
    skip it, their decision or the next pass settles it; on SQLite the IMMEDIATE transaction
    serialises instead) and re-checked in the ``UPDATE``. Then, by the action fixed at
    suspension:

    * ``deny`` — the pending turn is denied on behalf of the deadline (``ApprovalDecision
      (approved=False, by="deadline")`` in the loop state, its digest spent): ``queued`` for a
      worker, which tells the model the request expired and continues. An input request is
      answered the same way: nothing of the turn runs. A run whose configuration was
      deactivated meanwhile is failed instead (nobody should continue it).
    * ``fail`` — ``failed`` / ``approval_expired``, ``finished_at`` set, claim and turn cleared.
    * ``escalate`` — handed to the configuration's escalation group (``transitions.escalation``):
      it keeps waiting, with a second deadline whose action is the final one; the ``escalation``
      event is written. A configuration that cannot escalate now (deactivated, no group or no
      second deadline any more) gets its final action at once (``fail`` when deactivated).

    Deny and fail write one ``approval`` (or ``input``) event with ``by: "deadline"`` in the
    same transaction, chained from the run's ledger head, and the deadline and its action are
    cleared by the same ``UPDATE`` (the returned ``Expired`` carries the deadline that passed).
    ``None``: not overdue now (decided, cancelled, locked by a decider) — nothing written. The
    caller sends the wake-up (or, for an escalation, the notification).
    """
    with transaction.atomic():
        run = (
            AgentRun.objects.select_for_update(skip_locked=True)
            .filter(_overdue() & Q(pk=run_id))
            .first()
        )
        if run is None:
            return None
        pending = read_pending_turn(run)
        digest = stored_digest(run.pending_turn) or ""
        action = run.approval_timeout_action
        if action == ApprovalTimeoutAction.ESCALATE:
            plan = escalation_plan(run)
            if plan.possible:
                event = escalation_event(run, plan, digest)
                if escalate_locked(run, plan, event, segment=segment) is None:
                    return None  # pragma: no cover - impossible under the row lock
                return _expired(run, ApprovalTimeoutAction.ESCALATE, event)
            action = plan.fallback
        elif action != ApprovalTimeoutAction.DENY or not _active(run):
            action = ApprovalTimeoutAction.FAIL  # unknown or blank: the safe ending
        event = _event(run, pending, action, digest)
        statement = "expire_deny" if action == ApprovalTimeoutAction.DENY else "expire_fail"
        params = _ending_params(run, action, digest)
        if (
            locked_write(run, statement, params, [event], signer=(segment, run.lease_epoch)) is None
        ):  # pragma: no cover - impossible under the row lock
            return None
    return _expired(run, str(action), event)


def _ending_params(run: AgentRun, action: str, digest: str) -> dict[str, Any]:
    """The parameters of a deadline's deny (``expire_deny``) or fail (``expire_fail``): the run's
    status as locked (the guard), its loop state with the denial, and a failure's error. Both
    spend the deadline: the guard read it; ``Expired.deadline`` keeps it from the locked row."""
    decision = ApprovalDecision(approved=False, turn_digest=digest, by=DEADLINE)
    params: dict[str, Any] = {
        "status": run.status,
        "loop_state": with_decision(
            run.loop_state,
            decision=decision if action == ApprovalTimeoutAction.DENY else None,
            turn_digest=digest,
        ),
    }
    if action != ApprovalTimeoutAction.DENY:
        params["error"] = {
            "type": "ApprovalExpired",
            "message": f"nobody decided before the approval deadline ({run.status})",
        }
    return params


def _expired(run: AgentRun, action: str, event: EventSpec) -> Expired:
    return Expired(
        run_id=run.pk,
        run_uuid=run.uuid,
        waited=run.status,
        action=action,
        deadline=run.approval_deadline,
        event=event,
    )


def _active(run: AgentRun) -> bool:
    return AgentConfiguration.objects.filter(pk=run.configuration_id, is_active=True).exists()
