"""Standing approvals at use (docs/standing_approvals.md): a turn about to wait for approval is
approved at once when every call that needs a decision matches an active rule.

``turn_is_covered`` is the segment's read-only look before it suspends (one query): when it says
no, the turn suspends as it always did. When it says yes, the segment suspends and calls
``approve_by_rules`` in the suspend's own transaction, which decides afresh in plain order:

1. ``transitions.locked_waiting_run`` locks the run and checks the card's digest against what
   would run, exactly as a person's decision;
2. the matching rules are locked (``SELECT … FOR UPDATE``, in id order) with the active guard in
   the ``WHERE`` (not revoked, not expired by the database clock, uses left);
3. every call needing a decision is matched again (tool and ``arguments_schema`` on the locked
   turn's arguments), no call's preview failed, four-eyes holds for each author, and each
   author's approve authority over the call is read afresh (``rule_authority``);
4. each rule's uses are counted by a guarded ``UPDATE`` (row count 1, or nothing is approved),
   with a ``used`` audit event;
5. ``transitions.record_decision`` records an approval by the (first) rule's author, the rules
   named in its event, claimed for a ``resume:`` segment that continues at once.

All of it commits with the suspend or none of it does: a process dying anywhere before the
``COMMIT`` leaves the run running under its old lease (the reaper takes it back; the model's
turn is asked again), no use counted; after it, the run is claimed with the decision recorded
and the uses counted once. Any refusal rolls back to the savepoint: the run waits on its card.
A reconciliation (an in-doubt verdict) is never decided here: only a turn waiting for approval.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Q, QuerySet

from agentruns import selectors, transitions
from agentruns.authority import Decider, self_approval
from agentruns.exceptions import LeaseholdError
from agentruns.leases import Decided, EventSpec
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    ApprovalRule,
    ApprovalRuleEvent,
    EventKind,
    RuleEventKind,
    Status,
)
from agentruns.services.approval_rules import rule_authority
from agentruns.tools.schemas import InvalidSchema, schema_errors
from agentruns.turns import ApprovalDecision, Call, PendingTurn, read_pending_turn

logger = logging.getLogger(__name__)


class RuleDoesNotApply(Exception):
    """No rule approves this turn now (the reason is the message); the run waits on its card."""


@dataclass(frozen=True)
class Covered:
    """Which rule approves which call of a turn."""

    by_call: dict[str, ApprovalRule]

    def uses(self) -> Counter[int]:
        """Per rule id, the calls it approves in this turn."""
        return Counter(rule.pk for rule in self.by_call.values())

    def rules(self) -> list[ApprovalRule]:
        seen: dict[int, ApprovalRule] = {}
        for rule in self.by_call.values():
            seen.setdefault(rule.pk, rule)
        return list(seen.values())


def active_rules(configuration: AgentConfiguration, tools: set[str]) -> QuerySet[ApprovalRule]:
    """Rules of ``configuration`` for ``tools`` that may approve now
    (``selectors.active_rule``: not revoked, not expired by the database clock, a use left, an
    author). The guard of every use."""
    return ApprovalRule.objects.filter(
        selectors.active_rule(), configuration=configuration, tool__in=sorted(tools)
    )


def arguments_match(rule: ApprovalRule, arguments: Any) -> bool:
    """``arguments`` satisfy the rule's schema (the bounded validator; an argument too large to
    check, or a schema that cannot be applied, matches nothing)."""
    try:
        return not schema_errors(rule.arguments_schema, arguments)
    except InvalidSchema:
        return False


def _refusal(pending: PendingTurn) -> str | None:
    """Why no rule may approve ``pending`` whatever the rules say."""
    if not pending.readable or pending.kind != "approval":
        return "only a readable turn waiting for approval"
    if not any(call.needs_approval for call in pending.calls):
        return "no call needs a decision"
    for call in pending.calls:
        if call.preview is not None and not call.preview.ok:
            return f"the preview of {call.name} failed"
    return None


def cover(
    pending: PendingTurn,
    rules: list[ApprovalRule],
    *,
    configuration: AgentConfiguration,
    initiator_id: int | None,
) -> Covered:
    """For each call of ``pending`` that needs a decision, the first of ``rules`` (oldest first)
    for its tool whose schema its arguments satisfy, whose author may approve it under four-eyes
    and that has a use left after the calls before it; ``RuleDoesNotApply`` when a call has
    none, or the turn cannot be approved by a rule at all (``_refusal``)."""
    refusal = _refusal(pending)
    if refusal is not None:
        raise RuleDoesNotApply(refusal)
    taken: Counter[int] = Counter()
    by_call: dict[str, ApprovalRule] = {}
    for call in pending.calls:
        if not call.needs_approval:
            continue
        rule = next((r for r in rules if _fits(r, call, taken, configuration, initiator_id)), None)
        if rule is None:
            raise RuleDoesNotApply(f"no active rule matches {call.name} ({call.id})")
        taken[rule.pk] += 1
        by_call[call.id] = rule
    return Covered(by_call)


def _fits(
    rule: ApprovalRule,
    call: Call,
    taken: Counter[int],
    configuration: AgentConfiguration,
    initiator_id: int | None,
) -> bool:
    left = None if rule.max_uses is None else rule.max_uses - rule.uses - taken[rule.pk]
    return (
        rule.tool == call.name
        and (left is None or left > 0)
        and not self_approval(
            actor_id=rule.author_id,
            initiator_id=initiator_id,
            configuration=configuration,
            call=call,
        )
        and arguments_match(rule, call.arguments)
    )


def turn_is_covered(
    *, configuration: AgentConfiguration, pending: PendingTurn, initiator_id: int | None
) -> bool:
    """The segment's look before it suspends (read-only, no lock; one query unless no call
    needs a decision or the configuration has no unrevoked rule, ``has_standing_rules``):
    whether rules would approve ``pending``. Only a hint: the decision is
    ``approve_by_rules``'s, under the locks."""
    if not configuration.has_standing_rules or _refusal(pending) is not None:
        return False
    tools = {call.name for call in pending.calls if call.needs_approval}
    rules = list(active_rules(configuration, tools).order_by("created_at", "id"))
    if not rules:
        return False
    try:
        cover(pending, rules, configuration=configuration, initiator_id=initiator_id)
    except RuleDoesNotApply:
        return False
    return True


def approve_by_rules(*, run_uuid: Any, turn_digest: str, identity: str) -> Decided | None:
    """Approve the turn ``turn_digest`` the run ``run_uuid`` waits on, by the rules that cover
    it, in the caller's transaction (the suspend's); claimed by ``identity`` to continue inline.
    ``None``: no rule approves it now (nothing of this was written: a savepoint) and the run
    waits on its card. See the module docstring for the order of the checks."""
    try:
        with transitions.locked_waiting_run(
            run_uuid, expected_status=Status.WAITING_FOR_APPROVAL, turn_digest=turn_digest
        ) as run:
            return _approve_locked(run, turn_digest, identity)
    except RuleDoesNotApply as exc:
        logger.info("run %s: no standing approval: %s", run_uuid, exc)
    except LeaseholdError as exc:
        logger.warning("run %s: no standing approval: %s", run_uuid, exc.message)
    except Exception:  # fail closed: a person decides
        logger.exception("run %s: the standing approvals could not be checked", run_uuid)
    return None


def _approve_locked(run: AgentRun, turn_digest: str, identity: str) -> Decided:
    configuration = run.configuration
    if not configuration.is_active:
        raise RuleDoesNotApply("the configuration is not active")
    pending = read_pending_turn(run)
    tools = {call.name for call in pending.calls if call.needs_approval}
    locked = list(
        active_rules(configuration, tools)
        .select_related("author")
        .select_for_update(of=("self",))
        .order_by("id")
    )
    locked.sort(key=lambda rule: (rule.created_at, rule.pk))
    covered = cover(pending, locked, configuration=configuration, initiator_id=run.initiator_id)
    authorities = _require_authors(covered, configuration, pending)
    _count_uses(covered, run, pending)
    return transitions.record_decision(
        run,
        expected_status=Status.WAITING_FOR_APPROVAL,
        turn_digest=turn_digest,
        decision=ApprovalDecision(
            approved=True,
            decider_id=covered.rules()[0].author_id,
            turn_digest=turn_digest,  # by a person: the author, as the event says
        ),
        event=_approval_event(run, covered, pending, turn_digest, authorities),
        identity=identity,
    )


def _require_authors(
    covered: Covered, configuration: AgentConfiguration, pending: PendingTurn
) -> dict[str, Any]:
    """Each rule's author may still approve the calls it covers (read afresh: a permission or
    group lost, an account deactivated, counts at once); their permissions and group."""
    permissions: list[str] = []
    group = None
    for rule in covered.rules():
        decider = Decider.afresh(rule.author)
        for call_id, covering in covered.by_call.items():
            if covering.pk != rule.pk:
                continue
            call = next(c for c in pending.calls if c.id == call_id)
            authority = rule_authority(user=decider, configuration=configuration, tool=call.name)
            if not authority.allowed:
                raise RuleDoesNotApply(f"its author may no longer approve: {authority.refusal}")
            permissions.extend(authority.permissions)
            group = group or authority.group
    return {"permissions": list(dict.fromkeys(permissions)), "group": group}


def _count_uses(covered: Covered, run: AgentRun, pending: PendingTurn) -> None:
    """Count each rule's uses by a guarded ``UPDATE`` (its ``WHERE`` the active guard and the
    uses left) and write its ``used`` event; a row count of 0 approves nothing."""
    for rule_id, n in sorted(covered.uses().items()):
        counted = (
            active_rules(run.configuration, {r.tool for r in covered.rules() if r.pk == rule_id})
            .filter(pk=rule_id)
            .filter(Q(max_uses__isnull=True) | Q(uses__lte=F("max_uses") - n))
            .update(uses=F("uses") + n)
        )
        if counted != 1:
            raise RuleDoesNotApply("a rule was revoked, expired or used up meanwhile")
        rule = next(r for r in covered.rules() if r.pk == rule_id)
        ApprovalRuleEvent.objects.create(
            rule=rule,
            kind=RuleEventKind.USED,
            actor_id=rule.author_id,
            actor_ref=rule.author.get_username() if rule.author is not None else "",
            run_uuid=run.uuid,
            calls=n,
            payload={
                "turn_digest": pending.turn_digest,
                "call_ids": [cid for cid, r in covered.by_call.items() if r.pk == rule_id],
            },
        )


def _approval_event(
    run: AgentRun,
    covered: Covered,
    pending: PendingTurn,
    turn_digest: str,
    authority: dict[str, Any],
) -> EventSpec:
    first = covered.rules()[0]
    return EventSpec(
        EventKind.APPROVAL,
        {
            "approved": True,
            "by": "rule",
            "turn_digest": turn_digest,
            "mode": "inline",
            "decider": first.author.get_username() if first.author is not None else None,
            "calls": [{"id": c.id, "name": c.name} for c in pending.calls],
            "authority": authority,
            "rules": [
                {
                    "rule": str(rule.uuid),
                    "author": rule.author.get_username() if rule.author is not None else None,
                    "call_ids": [cid for cid, r in covered.by_call.items() if r.pk == rule.pk],
                }
                for rule in covered.rules()
            ],
        },
        actor_id=first.author_id,
    )
