"""The admin as an operator's window: configurations are edited here, runs and events are read.

Run state columns are read-only: they change only through ``agentruns.transitions``.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent


@admin.register(AgentConfiguration)
class AgentConfigurationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "provider", "model", "require_second_approver", "is_active"]
    list_filter = ["provider", "is_active", "require_second_approver"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at", "updated_at"]


class AgentRunEventInline(admin.TabularInline):
    model = AgentRunEvent
    extra = 0
    can_delete = False
    fields = ["sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor", "created_at"]
    readonly_fields = fields
    ordering = ["sequence"]
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: AgentRun | None = None) -> bool:
        return False


_RAW_STATE = ["loop_state", "pending_turn", "request", "pending_call", "error"]


@admin.register(AgentRun)
class AgentRunAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentRun | None = None) -> bool:
        return False

    @staticmethod
    def _pretty(value: object) -> str:
        return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))

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
class AgentRunEventAdmin(admin.ModelAdmin):
    list_display = ["run", "sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor"]
    list_filter = ["kind"]
    list_select_related = ["run", "actor"]
    readonly_fields = [f.name for f in AgentRunEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AgentRunEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentRunEvent | None = None) -> bool:
        return False
