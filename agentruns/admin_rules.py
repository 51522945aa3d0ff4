"""Standing approvals in the admin (docs/standing_approvals.md): rules are listed, made through
``services.approval_rules`` (the same checks as the API: the author's approve authority over the
tool, the bounded schema checker, the 30-day expiry) and revoked by an action; never edited or
deleted. Their audit (``ApprovalRuleEvent``) is read-only. Everything here needs
``agentruns.decide_agentrun``, checked on every request.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from agentruns.authority import DECIDE_PERMISSION
from agentruns.exceptions import InvalidRequest, LeaseholdError, NotPermitted
from agentruns.models import ApprovalRule, ApprovalRuleEvent
from agentruns.services.approval_rules import (
    approval_rule_check,
    approval_rule_create,
    approval_rule_revoke,
)

_FIELDS = ["configuration", "tool", "arguments_schema", "expires_at", "max_uses"]


class ApprovalRuleForm(forms.ModelForm):
    """The add form: the service's checks, as the requesting user, shown on their fields."""

    class Meta:
        model = ApprovalRule
        fields = _FIELDS

    request: HttpRequest | None = None

    def clean(self) -> dict[str, Any] | None:
        data = super().clean() or {}
        if self.errors or self.request is None:
            return data
        try:
            approval_rule_check(
                actor=self.request.user,
                configuration=data["configuration"].slug,
                tool=data.get("tool"),
                arguments_schema=data.get("arguments_schema"),
                expires_at=data.get("expires_at"),
                max_uses=data.get("max_uses"),
            )
        except InvalidRequest as exc:
            field = exc.detail.get("field")
            self.add_error(field if field in _FIELDS else None, exc.message)
        except NotPermitted as exc:
            raise forms.ValidationError(exc.message) from None
        return data


class _DecidersOnly(admin.ModelAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(DECIDE_PERMISSION)

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return request.user.has_perm(DECIDE_PERMISSION)

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(_DecidersOnly):
    """Rules: made here or by the API, revoked by the action (its author, or someone who may
    approve the tool), never edited or deleted."""

    form = ApprovalRuleForm
    list_display = [
        "uuid",
        "configuration",
        "tool",
        "author",
        "expires_at",
        "uses",
        "max_uses",
        "revoked_at",
    ]
    list_filter = ["configuration", "tool"]
    list_select_related = ["configuration", "author"]
    readonly_fields = ["uuid", "author", "created_at", "uses", "revoked_at", "revoked_by"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(DECIDE_PERMISSION)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.request = request  # type: ignore[attr-defined]  # the service checks as this user
        return form

    def save_model(self, request: HttpRequest, obj: ApprovalRule, form: Any, change: bool) -> None:
        rule = approval_rule_create(
            actor=request.user,
            configuration=obj.configuration.slug,
            tool=obj.tool,
            arguments_schema=obj.arguments_schema,
            expires_at=obj.expires_at,
            max_uses=obj.max_uses,
        )
        obj.pk = rule.pk
        obj.refresh_from_db()

    @admin.action(description="Revoke the selected rules")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApprovalRule]) -> None:
        for rule in queryset:
            try:
                approval_rule_revoke(actor=request.user, rule_uuid=rule.uuid)
            except LeaseholdError as exc:
                self.message_user(request, f"{rule}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{rule}: revoked", messages.SUCCESS)


@admin.register(ApprovalRuleEvent)
class ApprovalRuleEventAdmin(_DecidersOnly):
    """Read-only: every change to a rule (created, revoked, used), written with the change."""

    list_display = ["created_at", "rule", "kind", "actor_ref", "run_uuid", "calls"]
    list_filter = ["kind"]
    list_select_related = ["rule"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
