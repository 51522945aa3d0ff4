"""The admin as an operator's window: configurations are edited here, runs and events are read.

Run state columns are read-only: they change only through ``agentruns.transitions``. Runs and
events are those the user may see (``selectors.visible_runs``, docs/design.md §12.1); any other
run does not exist for them: not listed, and its pages answer 404.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.utils.html import format_html, format_html_join

from agentruns import selectors
from agentruns.exceptions import LeaseholdError
from agentruns.jsonview import pretty_json
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    McpServer,
    McpTransport,
)
from agentruns.services.mcp_sync import mcp_server_sync
from agentruns.tools.mcp import read_only_by_operator


@admin.register(AgentConfiguration)
class AgentConfigurationAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "provider",
        "model",
        "require_second_approver",
        "approver_group",
        "is_active",
    ]
    list_filter = ["provider", "is_active", "require_second_approver", "approver_group"]
    list_select_related = ["approver_group"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at", "updated_at"]
    actions = ["deactivate_and_cancel_waiting"]

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
    exist" redirect, the same in both cases, so nothing tells them apart."""

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


_RAW_STATE = ["loop_state", "pending_turn", "request", "pending_call", "error"]


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
        "created_at",
    ]
    list_filter = ["status", "termination_reason", "configuration"]
    search_fields = ["uuid", "prompt", "claimed_by"]
    date_hierarchy = "created_at"
    list_select_related = ["configuration", "initiator"]
    inlines = [AgentRunEventInline]
    exclude = _RAW_STATE
    readonly_fields = [
        *(f.name for f in AgentRun._meta.fields if f.name not in _RAW_STATE),
        "request_json",
        "pending_turn_json",
        "pending_call_json",
        "error_json",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentRun]:
        return selectors.visible_runs(user=request.user, queryset=super().get_queryset(request))

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


@admin.register(AgentRunEvent)
class AgentRunEventAdmin(_VisibleOnly):
    list_display = ["run", "sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor"]
    list_filter = ["kind"]
    list_select_related = ["run", "actor"]
    readonly_fields = [f.name for f in AgentRunEvent._meta.fields]

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
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

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
