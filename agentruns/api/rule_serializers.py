"""Request and response shapes of ``/api/approval-rules/`` (standing approvals,
docs/standing_approvals.md)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from agentruns.api.serializers import QuerySerializer
from agentruns.models import ApprovalRule
from agentruns.services.approval_rules import MAX_RULE_DAYS, MAX_RULE_USES

#: The most rules one list answers, newest first.
RULES_LIMIT = 500


class ApprovalRuleFilterSerializer(QuerySerializer):
    # A choice, not a BooleanField: DRF reads a BooleanField missing from a query as false.
    active = serializers.ChoiceField(
        choices=[("true", "true"), ("false", "false")],
        required=False,
        help_text="true: only rules that may approve now; false: only revoked, expired or used up.",
    )


class ApprovalRuleCreateSerializer(serializers.Serializer):
    configuration = serializers.SlugField(help_text="The slug of an active configuration.")
    tool = serializers.CharField(max_length=200, help_text="A tool the configuration offers.")
    arguments_schema = serializers.DictField(
        help_text="A JSON Schema the call's arguments must satisfy (RE2 patterns, local "
        "references only, no larger than a tool's arguments may be)."
    )
    expires_at = serializers.DateTimeField(
        help_text=f"When it stops approving: in the future, at most {MAX_RULE_DAYS} days away."
    )
    max_uses = serializers.IntegerField(
        min_value=1,
        max_value=MAX_RULE_USES,
        allow_null=True,
        required=False,
        default=None,
        help_text="Calls it may approve in all; null: no limit.",
    )


class ApprovalRuleSerializer(serializers.Serializer):
    uuid = serializers.UUIDField()
    configuration = serializers.SlugField(source="configuration.slug")
    tool = serializers.CharField()
    arguments_schema = serializers.DictField()
    author = serializers.CharField(source="author.get_username", allow_null=True, default=None)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    max_uses = serializers.IntegerField(allow_null=True)
    uses = serializers.IntegerField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField(
        source="revoked_by.get_username", allow_null=True, default=None
    )
    active = serializers.SerializerMethodField()

    def get_active(self, rule: ApprovalRule) -> bool:
        """Not revoked, not expired, a use left (as of this answer)."""
        return rule_is_active(rule)


def rule_is_active(rule: ApprovalRule) -> Any:
    return (
        rule.revoked_at is None
        and rule.expires_at > timezone.now()
        and (rule.max_uses is None or rule.uses < rule.max_uses)
    )
