"""``AgentRun`` and its append-only ``AgentRunEvent`` stream (docs/design.md §1).

Status, lease and fence columns are written only by ``agentruns.transitions``; nothing else may
``save()`` an existing run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from agentruns.models.choices import (
    TERMINAL_STATUSES,
    ApprovalTimeoutAction,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.models.configuration import AgentConfiguration


def _pin_versions(runs: Iterable[AgentRun]) -> None:
    """Pin each run inserted without a version to its configuration's current one
    (``services.versions``; one read per configuration), or, given a run's pinned view of a
    configuration, to the version that view shows."""
    from agentruns.services.versions import configuration_version_record

    pinned: dict[int, Any] = {}
    for run in runs:
        shown = run.configuration.pinned_version if run.config_version_id is None else None
        if shown is not None:  # started from another run's view: that same version
            run.config_version_id = shown.version_id
        elif run.config_version_id is None:
            key = run.configuration_id
            if key not in pinned:
                pinned[key] = configuration_version_record(configuration=run.configuration)
            run.config_version = pinned[key]


class AgentRunQuerySet(models.QuerySet["AgentRun"]):
    def bulk_create(self, objs: Iterable[AgentRun], *args: Any, **kwargs: Any) -> list[AgentRun]:
        """As Django's, each run pinned first (``_pin_versions``), as ``AgentRun.save`` does."""
        objs = list(objs)
        _pin_versions(objs)
        return super().bulk_create(objs, *args, **kwargs)


class AgentRun(models.Model):
    """One agent run. Its status, claim, lease and fence change only through transitions."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    configuration = models.ForeignKey(
        AgentConfiguration, on_delete=models.PROTECT, related_name="runs"
    )
    # The configuration's version the run started with (docs/configuration-versions.md): every
    # segment, decision and card reads the pinned settings from it. Set at insert (``save``).
    config_version = models.ForeignKey(
        "agentruns.ConfigurationVersion", on_delete=models.PROTECT, related_name="runs"
    )
    initiator = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_runs",
    )
    prompt = models.TextField()
    request = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=32, choices=Status.choices)
    termination_reason = models.CharField(
        max_length=32, choices=TerminationReason.choices, blank=True
    )

    claimed_by = models.CharField(max_length=255, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.PositiveIntegerField(default=0)
    pending_effect = models.CharField(max_length=32, choices=Effect.choices, blank=True)
    pending_call = models.JSONField(null=True, blank=True)
    requeue_count = models.PositiveIntegerField(default=0)
    loop_state = models.JSONField(default=dict, blank=True)
    pending_turn = models.JSONField(null=True, blank=True)

    output = models.TextField(blank=True)
    # With an ``output_schema``: the final answer as the JSON value it validated as
    # (``services.runtime.structured_output``); null otherwise.
    output_object = models.JSONField(null=True, blank=True)
    error = models.JSONField(default=dict, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    # What the run's model calls cost so far (AGENTRUNS["COST_CURRENCY"]; agentruns.budgets),
    # written with the events that record them.
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    iterations = models.PositiveIntegerField(default=0)
    truncated = models.BooleanField(default=False)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The database clock at insert, like every transition's ``updated_at = Now()``: the reaper's
    # redispatch compares it with the database clock (docs/design.md §8.4). Not ``auto_now``,
    # which stamps the app server's clock.
    updated_at = models.DateTimeField(db_default=Now())
    # The hash of the run's last event (``agentruns.ledger``): written with every event, in the
    # same guarded statement or transaction, so removing the last events is detected too.
    ledger_head = models.CharField(max_length=64, blank=True, default="", editable=False)
    # The approval deadline (docs/design.md §5.11): fixed by the database clock when the run
    # last started waiting for approval or input (Now() + the configuration's
    # ``approval_timeout``), with what happens then; null = no deadline. Meaningful only while
    # the run waits in one of those two states (a later wait writes both again).
    approval_deadline = models.DateTimeField(null=True, blank=True)
    approval_timeout_action = models.CharField(
        max_length=8, choices=ApprovalTimeoutAction.choices, blank=True
    )
    # The escalation of the current wait (``transitions.escalation``): when its first deadline
    # handed it to whom. Written with the second deadline; cleared when the run next suspends.
    # Meaningful only while the run waits for approval or input.
    escalated_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The sequence the run's next event takes (its last event's + 1; 0 with none): advanced by
    # the same guarded statement or transaction that appends events, so no writer reads
    # ``MAX(sequence)`` (docs/design.md §1.8).
    next_sequence = models.PositiveIntegerField(default=0, editable=False)
    # The run's OpenTelemetry trace (``agentruns.tracing``), written at insert when spans are
    # recorded: the trace id and the id of the run span every later span of the run is a child
    # of ("" with a trace id: the sampler dropped the run). Both "": no trace.
    trace_id = models.CharField(max_length=32, blank=True, default="", editable=False)
    trace_span_id = models.CharField(max_length=16, blank=True, default="", editable=False)
    # A run driven by an agent loop outside Leasehold (``agentruns.external``): the framework's
    # name ("langgraph", "openai-agents"; "" for a run Leasehold's own loop drives) and its saved
    # state (a LangGraph thread id, an Agents SDK ``RunState``), opaque to Leasehold and bounded
    # (``EXTERNAL_STATE_MAX_BYTES``). Nothing of Leasehold's loop, worker or inline decision
    # ever continues such a run: its external loop claims it again (docs/external.md).
    external_framework = models.CharField(max_length=64, blank=True, default="")
    external_state = models.JSONField(null=True, blank=True)

    objects = AgentRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "lease_expires"], name="agentrun_status_lease"),
            models.Index(fields=["status", "created_at"], name="agentrun_status_created"),
            models.Index(fields=["initiator", "created_at"], name="agentrun_initiator_created"),
            # Retention (services/retention.py): terminal runs by when they finished.
            models.Index(fields=["status", "finished_at"], name="agentrun_status_finished"),
            # The reaper's approval deadlines (services/deadlines.py).
            models.Index(fields=["status", "approval_deadline"], name="agentrun_status_deadline"),
        ]
        permissions = [
            ("decide_agentrun", "Can decide pending agent runs (approve, deny, input, reconcile)"),
            ("view_all_agentruns", "Can see every agent run, not only those they started"),
            ("cancel_agentrun", "Can cancel agent runs someone else started"),
            ("start_agentrun", "Can start agent runs (the API, the playground)"),
        ]

    def __str__(self) -> str:
        return f"{self.uuid} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Insert only (``transitions`` write an existing run): a run inserted without a
        version pins its configuration's current one (``services.versions``), whoever inserts
        it."""
        if self._state.adding:
            _pin_versions([self])
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class AgentRunEvent(models.Model):
    """One step of a run. Append-only; ``(run, sequence)`` is unique so no two writers agree;
    ``prev_hash``/``hash`` chain the run's events (``agentruns.ledger``)."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="events")
    sequence = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=EventKind.choices)
    segment = models.CharField(max_length=255, blank=True)
    lease_epoch = models.PositiveIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who decided (approval, input, reconciliation, cancel).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The actor's id as recorded, kept when the account is deleted (``actor`` becomes null): the
    # chain covers it, and ``actor`` must be it or null.
    actor_ref = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # The tamper-evident chain (agentruns.ledger): the previous event's hash and this one's,
    # the format it was chained in (1: before created_at and duration_ms were covered) and the
    # id of the key it was chained under ("": unkeyed SHA-256).
    prev_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    ledger_version = models.PositiveSmallIntegerField(default=2, editable=False)
    ledger_key = models.CharField(max_length=16, blank=True, default="", editable=False)

    class Meta:
        ordering = ["run", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["run", "sequence"], name="agentrunevent_run_sequence")
        ]
        indexes = [
            # The dashboard's windows (agentruns.dashboard.series): partial, so the many other
            # events cost no index write.
            models.Index(
                fields=["created_at"],
                condition=models.Q(kind="approval"),
                name="agentrunevent_approval_at",
            ),
            models.Index(
                fields=["created_at"],
                condition=models.Q(kind="reaper"),
                name="agentrunevent_reaper_at",
            ),
            # Input events are rare too: the dashboard finds the approval deadline's settles of
            # input requests through it.
            models.Index(
                fields=["created_at"],
                condition=models.Q(kind="input"),
                name="agentrunevent_input_at",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.sequence} {self.kind}"
