"""The admin as an operator's window: configurations are edited here, runs and events are read
(``agentruns.admin_runs``: read-only, only the runs the user may see); standing approvals are
made and revoked in ``agentruns.admin_rules``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from agentruns import selectors
from agentruns.admin_rules import ApprovalRuleAdmin, ApprovalRuleEventAdmin
from agentruns.admin_runs import AgentRunAdmin, AgentRunEventAdmin
from agentruns.admin_triggers import EventSourceAdmin, RunScheduleAdmin
from agentruns.admin_versions import ConfigurationVersionAdmin, versions_table
from agentruns.exceptions import LeaseholdError
from agentruns.jsonview import pretty_json
from agentruns.models import (
    AgentConfiguration,
    McpServer,
    McpTransport,
    NotificationState,
    SlackUser,
    SpendDay,
    SpendHold,
)
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.tools.mcp_tools import read_only_by_operator

# Registered by agentruns.admin_runs, admin_rules, admin_triggers and admin_versions.
__all__ = [
    "AgentRunAdmin",
    "AgentRunEventAdmin",
    "ApprovalRuleAdmin",
    "ApprovalRuleEventAdmin",
    "ConfigurationVersionAdmin",
    "EventSourceAdmin",
    "RunScheduleAdmin",
]

# A URL typed without a scheme is read as https (Django 6.0's default; Django 5.2 assumes http
# and warns). The allowlist (``agentruns.outbound.webhook_target``, run by the model's ``clean``)
# then judges the URL as completed, on https's port.
HTTPS_URLS: Mapping[type[models.Field[Any, Any]], Mapping[str, Any]] = {
    models.URLField: {"assume_scheme": "https"}
}


@admin.register(AgentConfiguration)
class AgentConfigurationAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "provider",
        "model",
        "require_second_approver",
        "approver_group",
        "daily_budget",
        "is_active",
    ]
    list_filter = ["provider", "is_active", "require_second_approver", "approver_group"]
    list_select_related = ["approver_group"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    # Versions: read-only, every save that changes a pinned setting adds one
    # (agentruns.services.versions).
    readonly_fields = ["created_at", "updated_at", "versions"]
    actions = ["deactivate_and_cancel_waiting"]
    formfield_overrides = HTTPS_URLS

    @admin.display(description="versions")
    def versions(self, configuration: AgentConfiguration) -> str:
        return versions_table(configuration)

    def save_model(
        self, request: HttpRequest, obj: AgentConfiguration, form: Any, change: bool
    ) -> None:
        """Save, naming the person as the author of the version the save makes (if any)."""
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)

    @admin.action(
        description="Deactivate, and cancel their runs waiting for a person",
        permissions=["change"],
    )
    def deactivate_and_cancel_waiting(
        self, request: HttpRequest, queryset: QuerySet[AgentConfiguration]
    ) -> None:
        """A deactivated configuration's waiting runs can no longer be decided (their decision
        would continue a run nobody should run): cancel them, each under the cancel rules."""
        from agentruns.services import runs  # the admin loads without the runtime

        queryset.update(is_active=False)
        cancelled, refused = 0, []
        for run_uuid in selectors.waiting_runs_of(configurations=queryset):
            try:
                cancelled += runs.run_cancel(
                    run_uuid=run_uuid, actor=request.user, note="configuration deactivated"
                )
            except LeaseholdError as exc:
                refused.append(f"{run_uuid}: {exc.message}")
        self.message_user(request, f"Deactivated; cancelled {cancelled} waiting run(s).")
        for line in refused:
            self.message_user(request, line, level=messages.WARNING)


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    """Remote tool servers. The server's hints are shown as information only: every remote
    tool is a non-idempotent write unless the operator lists it in ``read_only_tools``, and only
    ``requires_approval`` decides whether a write waits."""

    list_display = [
        "name",
        "transport",
        "endpoint",
        "enabled",
        "approval",
        "tool_count",
        "last_synced_at",
    ]
    list_filter = ["enabled", "transport", "requires_approval"]
    search_fields = ["name", "url"]
    actions = ["sync_tools"]
    readonly_fields = ["tools_table", "last_synced_at", "last_sync_error", "created_at"]
    exclude = ["tools_snapshot"]
    formfield_overrides = HTTPS_URLS

    @admin.display(description="endpoint")
    def endpoint(self, obj: McpServer) -> str:
        return obj.url if obj.transport == McpTransport.STREAMABLE_HTTP else obj.command

    @admin.display(description="approval")
    def approval(self, obj: McpServer) -> str:
        return "required" if obj.approval_required else "OFF (runs unattended, fenced)"

    @admin.display(description="tools")
    def tool_count(self, obj: McpServer) -> int:
        return len(obj.tools_snapshot) if isinstance(obj.tools_snapshot, list) else 0

    @admin.display(description="discovered tools (hints are the server's claims, not rules)")
    def tools_table(self, obj: McpServer) -> str:
        entries = obj.tools_snapshot if isinstance(obj.tools_snapshot, list) else []
        if not entries:
            return "— (run the “Sync tools” action)"
        rows = format_html_join(
            "",
            "<tr><td><code>{}</code><br>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td>"
            "<td>{}</td></tr>",
            (
                (
                    e.get("registered_name", ""),
                    e.get("name", ""),
                    e.get("description", ""),
                    ", ".join(f"{k}={v}" for k, v in sorted((e.get("hints") or {}).items())) or "—",
                    pretty_json(e.get("input_schema")),
                    (e.get("problem") or "ok")
                    + ("; read-only (your list)" if read_only_by_operator(obj, e) else ""),
                )
                for e in entries
                if isinstance(e, dict)
            ),
        )
        return format_html(
            "<p>Every remote tool is a <strong>non-idempotent write</strong> unless you list it "
            "in <em>read only tools</em>; the hints below decide nothing.</p>"
            "<table><tr><th>tool</th><th>description</th><th>hints</th>"
            "<th>input schema</th><th>status</th></tr>{}</table>",
            rows,
        )

    @admin.action(description="Sync tools (list them from the server)")
    def sync_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            result = mcp_server_sync(server=server)
            if not result.ok:
                self.message_user(request, f"{result.server_name}: {result.error}", messages.ERROR)
                continue
            detail = f"{len(result.snapshot)} tools"
            skipped = "; ".join(f"skipped {name!r}: {problem}" for name, problem in result.skipped)
            self.message_user(
                request,
                f"{result.server_name}: {detail}" + (f" ({skipped})" if skipped else ""),
                messages.WARNING if skipped else messages.SUCCESS,
            )


@admin.register(NotificationState)
class NotificationStateAdmin(admin.ModelAdmin):
    """Read-only: when each person (email) or configuration (webhook) was last sent a digest.
    Written only by ``agentruns.services.notifications``; deleting a row makes its recipient's
    next digest list every wait again."""

    list_display = ["channel", "user", "configuration", "last_sent_at"]
    list_filter = ["channel"]
    list_select_related = ["user", "configuration"]
    readonly_fields = ["channel", "user", "configuration", "last_sent_at", "claim", "told"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: NotificationState | None = None
    ) -> bool:
        return False


class _ReadOnly(admin.ModelAdmin):
    """A table written only by its own module: listed and shown, never added, changed or
    deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


@admin.register(SpendDay)
class SpendDayAdmin(_ReadOnly):
    """Read-only: the spend ledger per UTC day, per configuration and per user (written only by
    ``agentruns.budgets``). ``reserved`` is what the calls in flight hold."""

    list_display = [
        "day",
        "scope",
        "key",
        "amount",
        "reserved",
        "calls",
        "largest",
        "unknown_usage_calls",
        "lapsed_holds",
        "overruns",
    ]
    list_filter = ["scope", "day"]
    date_hierarchy = "day"


@admin.register(SpendHold)
class SpendHoldAdmin(_ReadOnly):
    """Read-only: the budget holds of the model calls in flight (written only by
    ``agentruns.budgets``). One past ``expires_at`` lapses at the reaper's next pass."""

    list_display = [
        "day",
        "scope",
        "key",
        "amount",
        "run_id",
        "segment",
        "created_at",
        "expires_at",
    ]
    list_filter = ["scope"]


@admin.register(SlackUser)
class SlackUserAdmin(admin.ModelAdmin):
    """Which Django account each Slack user's button presses act as (``manage.py slack_users``
    keeps the same table). A Slack user with no row decides nothing from Slack."""

    list_display = ["slack_user_id", "user", "created_at"]
    list_select_related = ["user"]
    search_fields = ["slack_user_id", "user__username"]
    raw_id_fields = ["user"]
    readonly_fields = ["created_at"]
