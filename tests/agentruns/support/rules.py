"""Standing approvals in tests: a rule made directly (as the service would), a run started on a
scripted turn, and what a rule's audit holds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from agentruns.models import AgentConfiguration, AgentRun, ApprovalRule, ApprovalRuleEvent
from agentruns.services.approval_rules import approval_rule_create
from agentruns.services.runs import run_start_sync
from agentruns.services.runtime.results import SegmentResult
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.runtime import DECIDE, call, tool_turn

#: The issue's example, on the probes' ``value``.
ONLY_OK = {"properties": {"value": {"const": "ok"}}, "required": ["value"]}


def author(**fields: Any):
    return UserFactory(permissions=[DECIDE], **fields)


def make_rule(
    configuration: AgentConfiguration,
    *,
    tool: str = "probe_write",
    schema: dict[str, Any] | None = None,
    by: Any = None,
    max_uses: int | None = None,
    days: int = 7,
) -> ApprovalRule:
    return approval_rule_create(
        actor=by if by is not None else author(),
        configuration=configuration.slug,
        tool=tool,
        arguments_schema=schema if schema is not None else ONLY_OK,
        expires_at=timezone.now() + timedelta(days=days),
        max_uses=max_uses,
    )


def start(
    configuration: AgentConfiguration, *calls: dict[str, Any], initiator: Any = None
) -> SegmentResult:
    """A run whose first turn proposes ``calls`` (default: ``probe_write`` with value ok)."""
    turn = tool_turn(*(calls or (call("probe_write", value="ok"),)))
    return run_start_sync(
        configuration=configuration,
        prompt="go",
        initiator=initiator,
        options={"script": [turn, {"content": "finished"}]},
    )


def uses(rule: ApprovalRule) -> int:
    return ApprovalRule.objects.values_list("uses", flat=True).get(pk=rule.pk)


def audit(rule: ApprovalRule) -> list[str]:
    return list(
        ApprovalRuleEvent.objects.filter(rule=rule).order_by("id").values_list("kind", flat=True)
    )


def row(run: AgentRun) -> AgentRun:
    return AgentRun.objects.get(pk=run.pk)
