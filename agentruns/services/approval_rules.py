"""Standing approvals: creating and revoking a rule (docs/standing_approvals.md). Using one is
``services.standing_approvals``.

Creating a rule needs what approving its tool's calls on its configuration needs
(``authority.approval_authority``: ``decide_agentrun``, the tool's ``approve_permission``, the
approver group), read afresh; its ``arguments_schema`` must pass the bounded checker
(``tools.schemas.check_matching_schema``: RE2 patterns, size and depth limits, local references
only); its expiry is at most ``MAX_RULE_DAYS`` days away. Revoking needs to be its author or to
hold that same authority. Each change is written with its ``ApprovalRuleEvent`` in one
transaction; a refusal changes nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists
from django.db.models.functions import Now
from django.utils import timezone

from agentruns.authority import Authority, Decider, approval_authority
from agentruns.exceptions import InvalidRequest, NotPermitted, RuleNotFound
from agentruns.models import AgentConfiguration, ApprovalRule, ApprovalRuleEvent, RuleEventKind
from agentruns.services._common import User
from agentruns.storable import json_problem
from agentruns.tools.gate import ToolGate
from agentruns.tools.schemas import InvalidSchema, check_matching_schema
from agentruns.turns import Call, PendingTurn

#: A rule lives at most this long.
MAX_RULE_DAYS = 30
#: The most uses a rule may be given.
MAX_RULE_USES = 1_000_000


def rule_authority(
    *, user: User | Decider, configuration: AgentConfiguration, tool: str
) -> Authority:
    """What approving a call of ``tool`` on ``configuration`` needs, and what ``user`` lacks:
    what a rule's author must hold when it is made and every time it is used."""
    return approval_authority(
        user=user,
        configuration=configuration,
        pending=PendingTurn.for_approval([Call(id="rule", name=tool)]),
    )


def _configuration(slug: Any) -> AgentConfiguration:
    found = (
        AgentConfiguration.objects.select_related("approver_group")
        .filter(slug=slug, is_active=True)
        .first()
        if isinstance(slug, str)
        else None
    )
    if found is None:
        raise InvalidRequest("no active configuration has this slug", field="configuration")
    return found


def _checked_tool(configuration: AgentConfiguration, tool: Any) -> str:
    if not isinstance(tool, str) or ToolGate.for_run(configuration, {}).available(tool) is None:
        raise InvalidRequest(
            f"{configuration.slug} offers no registered tool by this name", field="tool"
        )
    return tool


def _checked_expiry(expires_at: Any) -> datetime:
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        raise InvalidRequest("expires_at must be a date and time with its zone", field="expires_at")
    now = timezone.now()
    if expires_at <= now:
        raise InvalidRequest("expires_at must be in the future", field="expires_at")
    if expires_at > now + timedelta(days=MAX_RULE_DAYS):
        raise InvalidRequest(
            f"a rule lives at most {MAX_RULE_DAYS} days: expires_at is too far", field="expires_at"
        )
    return expires_at


def _checked_uses(max_uses: Any) -> int | None:
    if max_uses is None:
        return None
    if isinstance(max_uses, bool) or not isinstance(max_uses, int):
        raise InvalidRequest("max_uses must be a whole number or null", field="max_uses")
    if not 1 <= max_uses <= MAX_RULE_USES:
        raise InvalidRequest(f"max_uses must be from 1 to {MAX_RULE_USES}", field="max_uses")
    return max_uses


def _checked_schema(schema: Any) -> dict[str, Any]:
    # What the database refuses (NUL, a lone surrogate, NaN) is refused here, with the field,
    # before the schema checks: the admin's form reaches this without the API's strict parser.
    if (problem := json_problem(schema)) is not None:
        raise InvalidRequest(
            f"arguments_schema cannot be stored: {problem}", field="arguments_schema"
        )
    try:
        check_matching_schema(schema, what="arguments_schema")
    except InvalidSchema as exc:
        raise InvalidRequest(str(exc), field="arguments_schema") from None
    return dict(schema)


def rule_payload(rule: ApprovalRule) -> dict[str, Any]:
    """A rule as its ``created`` event records it."""
    return {
        "configuration": rule.configuration.slug,
        "tool": rule.tool,
        "arguments_schema": rule.arguments_schema,
        "expires_at": rule.expires_at.isoformat(),
        "max_uses": rule.max_uses,
    }


def _event(rule: ApprovalRule, kind: str, actor: Any, **fields: Any) -> ApprovalRuleEvent:
    return ApprovalRuleEvent.objects.create(
        rule=rule,
        kind=kind,
        actor_id=getattr(actor, "pk", None),
        actor_ref=actor.get_username() if actor is not None else "",
        **fields,
    )


def approval_rule_check(
    *,
    actor: User,
    configuration: Any,
    tool: Any,
    arguments_schema: Any,
    expires_at: Any,
    max_uses: Any = None,
) -> tuple[ApprovalRule, Authority]:
    """What ``approval_rule_create`` checks, writing nothing: the rule it would make (unsaved)
    and the authority its author holds; the same refusals (the admin's form shows them)."""
    config = _configuration(configuration)
    tool = _checked_tool(config, tool)
    schema = _checked_schema(arguments_schema)
    expiry = _checked_expiry(expires_at)
    uses = _checked_uses(max_uses)
    authority = rule_authority(user=Decider.afresh(actor), configuration=config, tool=tool)
    if not authority.allowed:
        raise NotPermitted(f"making this rule: {authority.refusal}")
    rule = ApprovalRule(
        configuration=config,
        tool=tool,
        arguments_schema=schema,
        author_id=actor.pk,
        expires_at=expiry,
        max_uses=uses,
    )
    return rule, authority


def approval_rule_create(
    *,
    actor: User,
    configuration: str,
    tool: str,
    arguments_schema: Any,
    expires_at: datetime,
    max_uses: int | None = None,
) -> ApprovalRule:
    """Make a standing approval by ``actor`` for calls of ``tool`` on the active configuration
    ``configuration`` (a slug) whose arguments satisfy ``arguments_schema``, until
    ``expires_at`` (at most ``MAX_RULE_DAYS`` days away), for at most ``max_uses`` calls.

    Refusals (nothing written): ``InvalidRequest`` naming the field (no such active
    configuration, a tool it does not offer, a schema the bounded checker refuses, an expiry in
    the past or too far, uses out of range); ``NotPermitted`` naming what approving the tool's
    calls needs and ``actor`` lacks (read afresh)."""
    rule, authority = approval_rule_check(
        actor=actor,
        configuration=configuration,
        tool=tool,
        arguments_schema=arguments_schema,
        expires_at=expires_at,
        max_uses=max_uses,
    )
    with transaction.atomic():
        rule.save()
        AgentConfiguration.objects.filter(pk=rule.configuration_id).update(has_standing_rules=True)
        _event(
            rule,
            RuleEventKind.CREATED,
            actor,
            payload={**rule_payload(rule), "authority": authority.as_payload()},
        )
    return rule


def _forget_rules_if_none_left(configuration_id: int) -> None:
    """Clear the configuration's ``has_standing_rules`` when none of its rules is left
    unrevoked (expired or used-up rules keep it set: the look then finds nothing)."""
    unrevoked = ApprovalRule.objects.filter(
        configuration_id=configuration_id, revoked_at__isnull=True
    )
    AgentConfiguration.objects.filter(pk=configuration_id).update(
        has_standing_rules=Exists(unrevoked)
    )


def _locked_rule(rule_uuid: UUID | str) -> ApprovalRule:
    try:
        return (
            ApprovalRule.objects.select_for_update(of=("self",))
            .select_related("configuration__approver_group")
            .get(uuid=rule_uuid)
        )
    except (ApprovalRule.DoesNotExist, ValidationError, ValueError):
        raise RuleNotFound() from None


def approval_rule_revoke(*, actor: User, rule_uuid: UUID | str) -> ApprovalRule:
    """Revoke the rule ``rule_uuid``: from the commit on it approves nothing (a use checks it
    under the same row lock). Its author may; anyone else needs what making it needs. Revoking a
    revoked rule changes nothing. Refusals: ``RuleNotFound``, ``NotPermitted``."""
    with transaction.atomic():
        rule = _locked_rule(rule_uuid)
        if rule.author_id is None or rule.author_id != actor.pk:
            authority = rule_authority(
                user=Decider.afresh(actor), configuration=rule.configuration, tool=rule.tool
            )
            if not authority.allowed:
                raise NotPermitted(f"revoking this rule: {authority.refusal}")
        if rule.revoked_at is not None:
            return rule
        ApprovalRule.objects.filter(pk=rule.pk).update(revoked_at=Now(), revoked_by_id=actor.pk)
        _forget_rules_if_none_left(rule.configuration_id)
        _event(rule, RuleEventKind.REVOKED, actor)
    rule.refresh_from_db()
    return rule
