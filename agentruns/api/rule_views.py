"""``/api/approval-rules/``: standing approvals listed, made, read and revoked (``DELETE``)
through ``agentruns.services.approval_rules`` (docs/standing_approvals.md). Staff only, as every
endpoint; reading needs ``agentruns.decide_agentrun``; making and revoking are checked by the
services (403 ``not_permitted`` naming what is missing)."""

from __future__ import annotations

from uuid import UUID

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from agentruns import selectors
from agentruns.api import rule_serializers as rs
from agentruns.api.views import LeaseholdAPIView, _errors, _parse
from agentruns.authority import DECIDE_PERMISSION
from agentruns.exceptions import NotPermitted, RuleNotFound
from agentruns.models import ApprovalRule
from agentruns.services import approval_rules

RULE_PARAMETER = OpenApiParameter("uuid", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _require_reader(request: Request) -> None:
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise NotPermitted(f"reading standing approvals needs {DECIDE_PERMISSION}")


def _rules() -> QuerySet[ApprovalRule]:
    return selectors.approval_rules()


class ApprovalRuleViewSet(viewsets.ViewSet):
    authentication_classes = LeaseholdAPIView.authentication_classes
    permission_classes = LeaseholdAPIView.permission_classes
    parser_classes = LeaseholdAPIView.parser_classes

    @extend_schema(
        operation_id="approval_rules_list",
        parameters=[rs.ApprovalRuleFilterSerializer],
        responses={200: rs.ApprovalRuleSerializer(many=True), **_errors(400)},
        description=f"Every standing approval, newest first (at most {rs.RULES_LIMIT}), revoked "
        "and expired ones too (active says). Needs agentruns.decide_agentrun.",
    )
    def list(self, request: Request) -> Response:
        _require_reader(request)
        active = _parse(rs.ApprovalRuleFilterSerializer, request.query_params).get("active")
        rules = selectors.approval_rules(active=None if active is None else active == "true")
        return Response(rs.ApprovalRuleSerializer(rules[: rs.RULES_LIMIT], many=True).data)

    @extend_schema(
        operation_id="approval_rules_create",
        request=rs.ApprovalRuleCreateSerializer,
        responses={201: rs.ApprovalRuleSerializer, **_errors(400)},
        description="Make a standing approval: calls of tool on configuration whose arguments "
        "satisfy arguments_schema are approved at once, in your name, until expires_at (at most "
        "30 days) and for at most max_uses calls. Needs what approving the tool's calls needs "
        "(agentruns.decide_agentrun, its approve_permission, the approver group: 403 "
        "not_permitted names what is missing). 400 invalid_request names the field: no such "
        "active configuration, a tool it does not offer, a schema the bounded checker refuses "
        "(too large or deep, a pattern RE2 refuses, a remote reference), an expiry in the past "
        "or too far. A rule never approves a turn in doubt, a call whose preview failed, or a "
        "run its author started under four-eyes.",
    )
    def create(self, request: Request) -> Response:
        data = _parse(rs.ApprovalRuleCreateSerializer, request.data)
        rule = approval_rules.approval_rule_create(actor=request.user, **data)
        rule = _rules().get(pk=rule.pk)
        return Response(rs.ApprovalRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="approval_rules_retrieve",
        parameters=[RULE_PARAMETER],
        responses={200: rs.ApprovalRuleSerializer, **_errors(404)},
    )
    def retrieve(self, request: Request, uuid: str) -> Response:
        _require_reader(request)
        rule = _rules().filter(uuid=uuid).first() if _is_uuid(uuid) else None
        if rule is None:
            raise RuleNotFound()
        return Response(rs.ApprovalRuleSerializer(rule).data)

    @extend_schema(
        operation_id="approval_rules_revoke",
        parameters=[RULE_PARAMETER],
        request=None,
        responses={200: rs.ApprovalRuleSerializer, **_errors(404)},
        description="Revoke the rule: from now on it approves nothing. Its author may; anyone "
        "else needs what making it needs (403 not_permitted). Revoking a revoked rule changes "
        "nothing. Answers the rule as it is now.",
    )
    def destroy(self, request: Request, uuid: str) -> Response:
        rule = approval_rules.approval_rule_revoke(actor=request.user, rule_uuid=uuid)
        return Response(rs.ApprovalRuleSerializer(_rules().get(pk=rule.pk)).data)


def _is_uuid(value: str) -> bool:
    try:
        UUID(value)
    except ValueError:
        return False
    return True
