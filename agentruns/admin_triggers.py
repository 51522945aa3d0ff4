"""The admin of what starts runs besides a person: run schedules and event sources are edited
here; the records of their starts and received events are read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from agentruns.event_requests import signing_secret
from agentruns.models import EventSource, ReceivedEvent, RunSchedule, ScheduledStart

TIMING_FIELDS = ("kind", "cron", "interval_seconds", "time_zone")


@admin.register(RunSchedule)
class RunScheduleAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "configuration",
        "kind",
        "cron",
        "interval_seconds",
        "enabled",
        "next_run_at",
    )
    list_filter = ("enabled", "kind", "configuration")
    search_fields = ("name", "configuration__slug")
    raw_id_fields = ("initiator",)

    def save_model(
        self, request: HttpRequest, obj: RunSchedule, form: ModelForm, change: bool
    ) -> None:
        # A changed timing is worked out afresh at the next tick, unless a due time was given.
        if (
            change
            and set(TIMING_FIELDS) & set(form.changed_data)
            and "next_run_at" not in form.changed_data
        ):
            obj.next_run_at = None
        super().save_model(request, obj, form, change)


@admin.register(EventSource)
class EventSourceAdmin(admin.ModelAdmin):
    list_display = ("configuration", "secret_env", "secret_set", "actor", "enabled")
    raw_id_fields = ("actor",)

    @admin.display(boolean=True, description="secret set")
    def secret_set(self, obj: EventSource) -> bool:
        return signing_secret(obj) is not None


class _Records(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ScheduledStart)
class ScheduledStartAdmin(_Records):
    list_display = ("schedule", "scheduled_for", "outcome", "run_uuid", "note")
    list_filter = ("outcome",)


@admin.register(ReceivedEvent)
class ReceivedEventAdmin(_Records):
    list_display = (
        "event_id",
        "configuration",
        "action",
        "correlation_key",
        "run_uuid",
        "received_at",
    )
    list_filter = ("action",)
    search_fields = ("event_id", "correlation_key")
