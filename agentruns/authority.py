"""Who may decide a pending turn (docs/design.md §5.6, §12.1): the authority a decision needs,
computed from the calls of the turn a human decides on, in one function for every interface;
and who may start a run through Leasehold's own interfaces.

* **Start** a run through the API or the playground needs ``agentruns.start_agentrun``
  (``start_authority``). Code that calls ``run_start_sync`` / ``run_enqueue`` itself decides who
  may start: the initiator it passes is recorded, not checked.

* **Deny**, **input** and **abandon** need ``agentruns.decide_agentrun``.
* **Approve** a turn, and say whether an in-doubt call **landed** or **not landed**, need
  ``agentruns.decide_agentrun``, the ``approve_permission`` of every call's tool, and — when the
  run's configuration names an ``approver_group`` — membership of that group, or of the group
  the wait was escalated to (``AgentRun.escalated_to``). A call whose tool is not registered
  (any more) can never be approved: its authority cannot be known (fail closed).
* **Approve from chat** (a Slack button) needs all of that, and also that the configuration
  allows it (``allow_chat_approval``) and that no preview of the turn failed
  (``chat_approval_problem``); deny needs no more than elsewhere.

The decision services (``agentruns.services.runs``) check ``approval_authority`` under the run's
row lock, against the pending turn read from the locked row and the configuration read afresh;
the inbox and the playground call the same function to decide which controls to offer. Superusers
hold every permission (``has_perm``), but group membership is membership: a superuser must be in
the group too. Read-only: nothing here writes, and nothing here is about a run's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group

from agentruns.models import AgentConfiguration
from agentruns.tools import registry
from agentruns.turns import (
    ANSWER,
    APPROVAL,
    APPROVE,
    DENY,
    EDIT,
    RECONCILIATION,
    Call,
    PendingTurn,
    VerdictName,
)

User = AbstractBaseUser | AnonymousUser

DECIDE_PERMISSION = "agentruns.decide_agentrun"
VIEW_ALL_PERMISSION = "agentruns.view_all_agentruns"
CANCEL_PERMISSION = "agentruns.cancel_agentrun"
START_PERMISSION = "agentruns.start_agentrun"

# How a refusal names the act, by the kind of pending turn.
_ACTS = {APPROVAL: "approving", RECONCILIATION: "reconciling"}


class Decider:
    """A user as the rules read them: permissions through ``has_perm`` (Django caches them on
    the user object), group memberships read at most once (one query, when first needed).

    Make one per request (the inbox shows a page of cards with one ``Decider``) or, with
    ``afresh``, per check (the services, under the lock, so that permissions and memberships
    are read as they stand then).
    """

    def __init__(self, user: User | None) -> None:
        self.user = user
        self._group_ids: frozenset[int] | None = None

    @classmethod
    def afresh(cls, user: User | None) -> Decider:
        """A decider read afresh (a decision's check, under the row lock): ``user`` read again,
        so that its permissions are too — Django caches them on a user object from its first
        ``has_perm``, and a permission revoked, an account deactivated or a superuser flag
        removed since must count. An account gone since is nobody (fail closed). One query,
        then the permission reads of the first ``has_perm`` (two with the model backend)."""
        if user is None or not user.is_authenticated:
            return cls(user)
        fresh = get_user_model()._default_manager.filter(pk=user.pk).first()
        return cls(fresh if fresh is not None else AnonymousUser())

    @property
    def authenticated(self) -> bool:
        return bool(self.user is not None and self.user.is_authenticated)

    def has_perm(self, permission: str) -> bool:
        return self.authenticated and bool(self.user.has_perm(permission))  # type: ignore[union-attr]

    def in_group(self, group_id: int) -> bool:
        """Membership of the group; ``False`` for anonymous users and for user models without
        groups (fail closed)."""
        if self._group_ids is None:
            groups = getattr(self.user, "groups", None) if self.authenticated else None
            self._group_ids = (
                frozenset(groups.values_list("pk", flat=True))
                if groups is not None
                else frozenset()
            )
        return group_id in self._group_ids


@dataclass(frozen=True)
class Authority:
    """What a decision needs and what its decider lacks.

    ``permissions`` and ``group`` are what was checked (recorded in the decision's event);
    ``missing`` names each thing the decider lacks, one sentence each (e.g. "approving
    call_webhook needs playground.approve_webhooks"); empty when they may. ``may_decide``:
    they hold ``decide_agentrun``, so they may deny (and abandon) even when they may not
    approve.
    """

    permissions: tuple[str, ...]
    group: str | None = None
    missing: tuple[str, ...] = ()
    may_decide: bool = True

    @property
    def allowed(self) -> bool:
        return not self.missing

    @property
    def refusal(self) -> str:
        """The missing pieces as one message (for ``NotPermitted``)."""
        return "; ".join(self.missing)

    def as_payload(self) -> dict[str, Any]:
        """``{"permissions": [...], "group": name | None}`` for a decision's event."""
        return {"permissions": list(self.permissions), "group": self.group}


def _decider(user: User | Decider | None) -> Decider:
    return user if isinstance(user, Decider) else Decider(user)


def deciding_authority(user: User | Decider | None) -> Authority:
    """What denying, input and abandon need: ``agentruns.decide_agentrun`` only."""
    decider = _decider(user)
    may_decide = decider.has_perm(DECIDE_PERMISSION)
    return Authority(
        permissions=(DECIDE_PERMISSION,),
        missing=() if may_decide else (f"deciding needs {DECIDE_PERMISSION}",),
        may_decide=may_decide,
    )


def start_authority(user: User | Decider | None) -> Authority:
    """What starting a run through the API or the playground needs:
    ``agentruns.start_agentrun``."""
    decider = _decider(user)
    may_start = decider.has_perm(START_PERMISSION)
    return Authority(
        permissions=(START_PERMISSION,),
        missing=() if may_start else (f"starting a run needs {START_PERMISSION}",),
        may_decide=decider.has_perm(DECIDE_PERMISSION),
    )


def approval_authority(
    *,
    user: User | Decider | None,
    configuration: AgentConfiguration,
    pending: PendingTurn,
    escalated_to: Group | None = None,
) -> Authority:
    """What approving ``pending`` (an approval turn) or a landed / not landed verdict on it (a
    reconciliation turn) needs, and what ``user`` lacks.

    Reads the registry for each call's tool (a name no tool has is missing authority) and
    ``configuration.approver_group`` (select it with the configuration to save a query); a
    group membership costs one query per ``Decider``. ``escalated_to``: the group the run's
    wait was escalated to (``escalation_of``), whose members may approve as the approver
    group's do. Any other kind of turn (input, unreadable) needs what deciding needs: no
    control approves it.
    """
    decider = _decider(user)
    deciding = deciding_authority(decider)
    act = _ACTS.get(pending.kind)
    if act is None:
        return deciding
    permissions = [DECIDE_PERMISSION]
    missing = [f"{act} needs {DECIDE_PERMISSION}"] if not deciding.may_decide else []
    for call in pending.calls:
        tool = registry.get(call.name)
        if tool is None:
            missing.append(f"{act} {call.name} needs a registered tool: {call.name} is not one")
            continue
        if tool.approve_permission is None:
            continue
        permissions.append(tool.approve_permission)
        if not decider.has_perm(tool.approve_permission):
            missing.append(f"{act} {call.name} needs {tool.approve_permission}")
    group = configuration.approver_group if configuration.approver_group_id else None
    if group is not None and not decider.in_group(group.pk):
        if escalated_to is not None and decider.in_group(escalated_to.pk):
            group = escalated_to  # the wait was handed to them
        else:
            also = f" or of {escalated_to.name!r} (escalated)" if escalated_to is not None else ""
            missing.append(
                f"{act} runs of {configuration.slug} needs membership of the group "
                f"{group.name!r}{also}"
            )
    return Authority(
        permissions=tuple(dict.fromkeys(permissions)),
        group=group.name if group is not None else None,
        missing=tuple(dict.fromkeys(missing)),
        may_decide=deciding.may_decide,
    )


def call_authority(
    *,
    user: User | Decider | None,
    configuration: AgentConfiguration,
    call: Call,
    escalated_to: Group | None = None,
) -> Authority:
    """What approving the one call ``call`` of an approval turn needs, and what ``user`` lacks:
    ``approval_authority`` for that call alone (``escalated_to`` as there). Answering and
    editing a call need the same (the person's answer or arguments stand in for the tool's);
    denying needs deciding only."""
    return approval_authority(
        user=user,
        configuration=configuration,
        pending=PendingTurn.for_approval([call]),
        escalated_to=escalated_to,
    )


def self_approval(
    *,
    actor_id: object,
    initiator_id: int | None,
    configuration: AgentConfiguration,
    call: Call | None = None,
) -> bool:
    """Four-eyes (``configuration.require_second_approver``): whether approving would be the
    actor approving their own work — they started the run, or they edited ``call``'s arguments
    (the editor is their author). Such an actor may deny, answer or edit, not approve."""
    if not configuration.require_second_approver or actor_id is None:
        return False
    if initiator_id is not None and initiator_id == actor_id:
        return True
    return call is not None and call.edit is not None and call.edit.editor_id == actor_id


@dataclass(frozen=True)
class CallChoices:
    """Which verdicts a reader may give one call of an approval card (``call_choices``).

    ``verdicts``: in the order ``approve``, ``deny``, ``answer``, ``edit`` (a subset; empty
    when the reader may not decide at all). ``missing``: why approving (answering, editing) is
    not offered, one sentence each. ``self_approval``: four-eyes keeps *approve* from them
    (they started the run, or edited this call); they may still deny, answer and edit."""

    call_id: str
    verdicts: tuple[VerdictName, ...]
    missing: tuple[str, ...] = ()
    self_approval: bool = False

    def allows(self, verdict: str) -> bool:
        return verdict in self.verdicts

    @property
    def refusal(self) -> str:
        return "; ".join(self.missing)


def call_choices(
    *,
    user: User | Decider | None,
    configuration: AgentConfiguration,
    pending: PendingTurn,
    initiator_id: int | None,
    escalated_to: Group | None = None,
) -> tuple[CallChoices, ...]:
    """For each call of the approval turn ``pending`` (as a card shows it), in order, the
    verdicts ``user`` may give it: the rules the decision service checks under the row lock
    (``call_authority`` per call, with the run's ``escalation_of``; ``self_approval``), so a
    card offers exactly what will be accepted. Any other kind of turn: no choices. One group
    read per ``Decider``."""
    if pending.kind != APPROVAL:
        return ()
    decider = _decider(user)
    actor_id = decider.user.pk if decider.authenticated else None  # type: ignore[union-attr]
    choices = []
    for call in pending.calls:
        authority = call_authority(
            user=decider, configuration=configuration, call=call, escalated_to=escalated_to
        )
        if not authority.may_decide:
            choices.append(CallChoices(call.id, (), authority.missing))
            continue
        own = self_approval(
            actor_id=actor_id, initiator_id=initiator_id, configuration=configuration, call=call
        )
        verdicts: tuple[VerdictName, ...] = (DENY,)
        if authority.allowed:
            verdicts = (DENY, ANSWER, EDIT) if own else (APPROVE, DENY, ANSWER, EDIT)
        choices.append(CallChoices(call.id, verdicts, authority.missing, own))
    return tuple(choices)


def escalation_of(run: Any) -> Group | None:
    """The group ``run``'s current wait was escalated to, or ``None`` (not escalated, not
    waiting for approval or input, or the group is gone). Reads ``run.escalated_to`` (select it
    with the run to save a query)."""
    from agentruns.models import DEADLINE_STATUSES

    if run.status not in DEADLINE_STATUSES or run.escalated_at is None:
        return None
    return run.escalated_to if run.escalated_to_id is not None else None


def chat_approval_problem(*, configuration: AgentConfiguration, pending: PendingTurn) -> str | None:
    """Why ``pending`` may not be approved from chat, or ``None`` when it may (the person's
    authority is checked as everywhere else): the configuration must allow it
    (``allow_chat_approval``), the turn must be an approval and none of its previews may have
    failed — a person approving a write whose preview failed reads the whole card first."""
    if not configuration.allow_chat_approval:
        return f"{configuration.slug} does not allow approving from chat"
    if pending.kind != APPROVAL:
        return "only an approval can be given from chat"
    for call in pending.calls:
        if call.preview is not None and not call.preview.ok:
            return f"the preview of {call.name} failed: read the card before approving"
    return None


def cancel_authority(
    user: User | Decider | None, *, initiator_id: int | None, in_doubt: bool
) -> Authority:
    """What cancelling a run needs (docs/design.md §12.1), and what ``user`` lacks: having
    started it (``initiator_id``) or ``agentruns.cancel_agentrun``; a run in doubt
    (``in_doubt``: ``waiting_for_reconciliation``) also needs ``agentruns.decide_agentrun``, as
    abandoning it does. ``may_decide`` says whether they hold ``decide_agentrun`` (the cancel's
    guard lets them end a run that goes in doubt meanwhile). The service checks this against the
    run it read, and its guard against the run as it is; the screens call it to decide whether
    to offer *Cancel run*."""
    decider = _decider(user)
    own = (
        initiator_id is not None and decider.authenticated and initiator_id == decider.user.pk  # type: ignore[union-attr]
    )
    missing: list[str] = []
    permissions = [] if own else [CANCEL_PERMISSION]
    if not own and not decider.has_perm(CANCEL_PERMISSION):
        missing.append(f"cancelling a run someone else started needs {CANCEL_PERMISSION}")
    may_decide = decider.has_perm(DECIDE_PERMISSION)
    if in_doubt:
        permissions.append(DECIDE_PERMISSION)
        if not may_decide:
            missing.append(
                f"cancelling a run in doubt needs {DECIDE_PERMISSION}, as abandoning it does"
            )
    return Authority(permissions=tuple(permissions), missing=tuple(missing), may_decide=may_decide)
