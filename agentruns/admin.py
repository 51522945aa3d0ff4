"""The admin as an operator's window: configurations are edited here, runs and events are read.

Run state columns are read-only: they change only through ``agentruns.transitions``. Runs and
events are those the user may see (``selectors.visible_runs``, docs/design.md §12.1); any other
run does not exist for them: not listed, and its pages answer 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join

from agentruns import budgets, selectors
from agentruns.authority import DECIDE_PERMISSION
from agentruns.exceptions import LeaseholdError
from agentruns.jsonview import pretty_json
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    McpServer,
    McpTransport,
    NotificationState,
    SlackUser,
    SpendDay,
    SpendHold,
)
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.tools.mcp_tools import read_only_by_operator

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
    readonly_fields = ["created_at", "updated_at"]
    actions = ["deactivate_and_cancel_waiting"]
    formfield_overrides = HTTPS_URLS

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


class _VisibleOnly(admin.ModelAdmin):
    """For run tables narrowed (``get_queryset``) to what the user may see: a row outside the
    queryset — missing or not theirs to see — answers 404 instead of the admin's "does not
    exist" redirect, the same in both cases, so nothing tells them apart.

    Reviewers (``agentruns.decide_agentrun``) may view them too, without the model's view
    permission: the rows are still only the runs they may see (docs/design.md §12.1), and
    their admin sidebar lists runs and events instead of announcing nothing to see."""

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(DECIDE_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or request.user.has_perm(DECIDE_PERMISSION)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> models.Model:
        found = super().get_object(request, object_id, from_field)
        if found is None:
            raise Http404(f"no {self.opts.verbose_name} {object_id!r}")
        return found


class AgentRunEventInline(admin.TabularInline):
    model = AgentRunEvent
    extra = 0
    can_delete = False
    fields = ["sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor", "created_at"]
    readonly_fields = fields  # type: ignore[assignment]  # flat names, no groups
    ordering = ["sequence"]
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: AgentRun | None = None) -> bool:
        return False


_RAW_STATE = ["loop_state", "pending_turn", "request", "pending_call", "error", "output_object"]


@admin.register(AgentRun)
class AgentRunAdmin(_VisibleOnly):
    list_display = [
        "uuid",
        "configuration",
        "status",
        "termination_reason",
        "initiator",
        "claimed_by",
        "lease_epoch",
        "requeue_count",
        "cost_shown",
        "created_at",
    ]
    list_filter = ["status", "termination_reason", "configuration"]
    search_fields = ["uuid", "prompt", "claimed_by"]
    date_hierarchy = "created_at"
    list_select_related = ["configuration", "initiator"]
    inlines = [AgentRunEventInline]
    exclude = [*_RAW_STATE, "cost"]  # shown as cost_shown, with its currency
    readonly_fields = [
        *(
            "cost_shown" if f.name == "cost" else f.name
            for f in AgentRun._meta.fields
            if f.name not in _RAW_STATE
        ),
        "request_json",
        "pending_turn_json",
        "pending_call_json",
        "error_json",
        "output_object_json",
    ]

    actions = ["cancel_runs"]

    def get_urls(self) -> list[URLPattern]:
        """The operations dashboard (``agentruns.dashboard``) at ``dashboard/``, ahead of the
        change view's catch-all; ``admin_view`` checks staff on every request, the view the
        permission."""
        from agentruns.dashboard.pages import dashboard  # pygal loads with the page only

        def view(request: HttpRequest) -> HttpResponse:
            return dashboard(request, admin_site=self.admin_site)

        return [
            path("dashboard/", self.admin_site.admin_view(view), name="agentruns_dashboard"),
            *super().get_urls(),
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentRun]:
        return selectors.visible_runs(user=request.user, queryset=super().get_queryset(request))

    @admin.display(description="cost", ordering="cost")
    def cost_shown(self, run: AgentRun) -> str:
        """The run's cost so far with the currency (AGENTRUNS["COST_CURRENCY"])."""
        return f"{run.cost} {budgets.currency()}"

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Offered to whoever may view runs here; each run is then cancelled under the cancel
        service's own rules (its initiator, or ``agentruns.cancel_agentrun``; in doubt also
        ``decide_agentrun``), and a refusal is reported per run."""
        return self.has_view_permission(request)

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def cancel_runs(
        self, request: HttpRequest, queryset: QuerySet[AgentRun]
    ) -> HttpResponse | None:
        """A confirmation page first (no JavaScript needed); on ``post=yes`` each selected run is
        cancelled through ``runs.run_cancel`` — its rules, its guarded write — and what happened
        to each is reported: cancelled, already ended, or refused and why."""
        from agentruns.services import runs  # the admin loads without the runtime

        selected = list(queryset.select_related("configuration", "initiator").order_by("pk"))
        if request.POST.get("post") != "yes":
            return TemplateResponse(
                request,
                "admin/agentruns/agentrun/cancel_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Cancel these runs?",
                    "opts": self.model._meta,
                    "runs": selected,
                    "action": "cancel_runs",
                    "action_checkbox_name": ACTION_CHECKBOX_NAME,
                },
            )
        cancelled, ended = 0, 0
        for run in selected:
            try:
                if runs.run_cancel(
                    run_uuid=run.uuid, actor=request.user, note="cancelled in the admin"
                ):
                    cancelled += 1
                else:
                    ended += 1
            except LeaseholdError as exc:
                self.message_user(
                    request, f"Run {run.uuid}: not cancelled: {exc.message}", messages.ERROR
                )
        self.message_user(
            request,
            f"Cancelled {cancelled} run(s); {ended} had already ended.",
            messages.SUCCESS if cancelled else messages.WARNING,
        )
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentRun | None = None) -> bool:
        return False

    @staticmethod
    def _pretty(value: object) -> str:
        return format_html("<pre>{}</pre>", pretty_json(value))

    @admin.display(description="request")
    def request_json(self, obj: AgentRun) -> str:
        return self._pretty(obj.request)

    @admin.display(description="pending turn")
    def pending_turn_json(self, obj: AgentRun) -> str:
        return self._pretty(obj.pending_turn)

    @admin.display(description="pending call (fence)")
    def pending_call_json(self, obj: AgentRun) -> str:
        return self._pretty(obj.pending_call)

    @admin.display(description="error")
    def error_json(self, obj: AgentRun) -> str:
        return self._pretty(obj.error)

    @admin.display(description="output object")
    def output_object_json(self, obj: AgentRun) -> str:
        return self._pretty(obj.output_object)


@admin.register(AgentRunEvent)
class AgentRunEventAdmin(_VisibleOnly):
    list_display = ["run", "sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor"]
    list_filter = ["kind"]
    list_select_related = ["run", "actor"]
    exclude = ["payload"]
    readonly_fields = [
        *(f.name for f in AgentRunEvent._meta.fields if f.name != "payload"),
        "payload_json",
    ]

    @admin.display(description="payload")
    def payload_json(self, obj: AgentRunEvent) -> str:
        return format_html("<pre>{}</pre>", pretty_json(obj.payload))

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentRunEvent]:
        return selectors.visible_events(user=request.user, queryset=super().get_queryset(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AgentRunEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentRunEvent | None = None) -> bool:
        return False


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
