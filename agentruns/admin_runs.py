"""The admin's run and event pages: read-only windows on the runs a user may see.

Runs and events are those the user may see (``selectors.visible_runs``, docs/design.md §12.1);
any other run does not exist for them: not listed, and its pages answer 404. Nothing here
changes a run (no Save): its state changes only through ``agentruns.transitions``, and the one
action, *Cancel selected runs…*, goes through ``runs.run_cancel``. Times are shown as every
Leasehold page shows them (``leasehold.when``: the page's zone, named), run ids as short ids
with the whole id on hover and in full on the run's page, rounds and tokens as
``agentruns.run_counts`` counts them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.html import format_html

from agentruns import display, selectors
from agentruns.authority import DECIDE_PERMISSION
from agentruns.exceptions import LeaseholdError
from agentruns.jsonview import pretty_json
from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.run_counts import run_counts
from agentruns.templatetags.leasehold import age, run_id, when
from agentruns.turns import read_pending_turn, waits_for_a_human


class _VisibleOnly(admin.ModelAdmin):
    """For run tables narrowed (``get_queryset``) to what the user may see: a row outside the
    queryset — missing or not theirs to see — answers 404 instead of the admin's "does not
    exist" redirect, the same in both cases, so nothing tells them apart.

    Reviewers (``agentruns.decide_agentrun``) may view them too, without the model's view
    permission: the rows are still only the runs they may see (docs/design.md §12.1), and
    their admin sidebar lists runs and events instead of announcing nothing to see. Nobody
    changes, adds or deletes a row here."""

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return super().has_view_permission(request, obj) or request.user.has_perm(DECIDE_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return super().has_module_permission(request) or request.user.has_perm(DECIDE_PERMISSION)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

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
    fields = ["sequence", "kind", "summary", "segment", "lease_epoch", "duration", "actor", "at"]
    readonly_fields = fields  # type: ignore[assignment]  # flat names, no groups
    ordering = ["sequence"]
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: AgentRun | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="what happened")
    def summary(self, event: AgentRunEvent) -> str:
        from agentruns.event_summaries import summarise

        return summarise(event.kind, event.payload)

    @admin.display(description="duration")
    def duration(self, event: AgentRunEvent) -> str:
        return "—" if event.duration_ms is None else f"{event.duration_ms} ms"

    @admin.display(description="when")
    def at(self, event: AgentRunEvent) -> str:
        return when(event.created_at)


def waiting_for(run: AgentRun) -> str:
    """What the run waits for, in words: a person (and for which calls), a worker, or nothing."""
    if run.status == Status.QUEUED:
        return "a worker"
    if not waits_for_a_human(run):
        return "—"
    pending = read_pending_turn(run)
    names = ", ".join(dict.fromkeys(call.name for call in pending.calls))
    what = display.status_label(run.status).removeprefix("waiting for ")
    if not pending.readable:
        return f"{what} (what it waits on cannot be read)"
    return f"{what}: {names}" if names else what


@admin.register(AgentRun)
class AgentRunAdmin(_VisibleOnly):
    list_display = [
        "short_id",
        "status_shown",
        "configuration_shown",
        "initiator_shown",
        "age",
        "cost_shown",
        "waiting_for_shown",
    ]
    list_display_links = ["short_id"]
    list_filter = ["status", "termination_reason", "configuration"]
    search_fields = ["uuid", "prompt", "claimed_by"]
    date_hierarchy = "created_at"
    list_select_related = ["configuration", "initiator"]
    inlines = [AgentRunEventInline]
    # The detail page's groups of (read-only) fields, by heading.
    sections: dict[str | None, list[str]] = {
        None: [
            "uuid",
            "configuration",
            "initiator_shown",
            "status_shown",
            "waiting_for_shown",
            "prompt",
            "output",
            "output_object_json",
            "error_json",
        ],
        "Counts": ["rounds", "tokens", "cost_shown", "truncated", "requeue_count"],
        "Times": [
            "created_shown",
            "started_shown",
            "finished_shown",
            "updated_shown",
            "deadline_shown",
        ],
        "Lease and fence": [
            "claimed_by",
            "lease_epoch",
            "lease_expires_shown",
            "pending_effect",
            "pending_call_json",
        ],
        "Stored state": ["request_json", "pending_turn_json", "next_sequence", "ledger_head"],
    }
    fieldsets = [(title, {"fields": tuple(fields)}) for title, fields in sections.items()]
    readonly_fields = [field for fields in sections.values() for field in fields]
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

    @staticmethod
    def _pretty(value: object) -> str:
        return format_html("<pre>{}</pre>", pretty_json(value))

    # --- Columns -------------------------------------------------------------------------------

    @admin.display(description="run", ordering="uuid")
    def short_id(self, run: AgentRun) -> str:
        return run_id(run.uuid)

    @admin.display(description="status", ordering="status")
    def status_shown(self, run: AgentRun) -> str:
        reason = display.reason_label(run.termination_reason)
        shown = display.status_label(run.status)
        return f"{shown} ({reason})" if reason and run.termination_reason != run.status else shown

    @admin.display(description="configuration", ordering="configuration__slug")
    def configuration_shown(self, run: AgentRun) -> str:
        """Its slug (short, so that every column fits at 1280 px), its name on hover."""
        configuration = run.configuration
        return format_html('<span title="{}">{}</span>', configuration.name, configuration.slug)

    @admin.display(description="initiator", ordering="initiator__username")
    def initiator_shown(self, run: AgentRun) -> str:
        return run.initiator.get_username() if run.initiator else "unknown"

    @admin.display(description="age", ordering="-created_at")
    def age(self, run: AgentRun) -> str:
        return age(run.created_at)

    @admin.display(description="cost", ordering="cost")
    def cost_shown(self, run: AgentRun) -> str:
        """The run's cost so far with the currency (AGENTRUNS["COST_CURRENCY"]); "—" for none
        (an unpriced configuration)."""
        return display.money(run.cost) if run.cost else "—"

    @admin.display(description="waiting for")
    def waiting_for_shown(self, run: AgentRun) -> str:
        return waiting_for(run)

    @admin.display(description="rounds")
    def rounds(self, run: AgentRun) -> int:
        return run_counts(run).rounds

    @admin.display(description="tokens (prompt + completion)")
    def tokens(self, run: AgentRun) -> str:
        counts = run_counts(run)
        return f"{counts.prompt_tokens} + {counts.completion_tokens} = {counts.total_tokens}"

    @admin.display(description="created")
    def created_shown(self, run: AgentRun) -> str:
        return when(run.created_at)

    @admin.display(description="started")
    def started_shown(self, run: AgentRun) -> str:
        return when(run.started_at)

    @admin.display(description="finished")
    def finished_shown(self, run: AgentRun) -> str:
        return when(run.finished_at)

    @admin.display(description="updated")
    def updated_shown(self, run: AgentRun) -> str:
        return when(run.updated_at)

    @admin.display(description="approval deadline")
    def deadline_shown(self, run: AgentRun) -> str:
        return when(run.approval_deadline)

    @admin.display(description="lease expires")
    def lease_expires_shown(self, run: AgentRun) -> str:
        return when(run.lease_expires)

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

    # --- Cancel ----------------------------------------------------------------------------------

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


@admin.register(AgentRunEvent)
class AgentRunEventAdmin(_VisibleOnly):
    list_display = ["run", "sequence", "kind", "segment", "lease_epoch", "duration_ms", "actor"]
    list_filter = ["kind"]
    list_select_related = ["run", "actor"]
    exclude = ["payload"]
    readonly_fields = [
        *(f.name for f in AgentRunEvent._meta.fields if f.name not in ("payload", "created_at")),
        "at",
        "payload_json",
    ]

    @admin.display(description="created at")
    def at(self, event: AgentRunEvent) -> str:
        return when(event.created_at)

    @admin.display(description="payload")
    def payload_json(self, obj: AgentRunEvent) -> str:
        return format_html("<pre>{}</pre>", pretty_json(obj.payload))

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentRunEvent]:
        return selectors.visible_events(user=request.user, queryset=super().get_queryset(request))
