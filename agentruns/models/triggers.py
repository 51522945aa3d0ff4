"""What starts runs besides a person: ``RunSchedule`` (cron or interval) with its
``ScheduledStart`` records, and ``EventSource`` (a configuration's signed-event endpoint) with its
``ReceivedEvent`` records.

The two record tables carry the idempotency: one ``ScheduledStart`` per (schedule, due time) and
one ``ReceivedEvent`` per (configuration, event id), each a unique constraint, so a tick or an
event delivered twice finds the first one's row and starts nothing (docs/schedules_and_events.md).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from agentruns import schedule_times
from agentruns.secrets import secret_env_problem

#: The longest event id and correlation key an event may carry.
EVENT_KEY_MAX = 200


class ScheduleKind(models.TextChoices):
    CRON = schedule_times.CRON, "cron"
    INTERVAL = schedule_times.INTERVAL, "interval"


class RunSchedule(models.Model):
    """Start a run of ``configuration`` with ``prompt`` as ``initiator`` at every due time."""

    configuration = models.ForeignKey(
        "agentruns.AgentConfiguration", on_delete=models.CASCADE, related_name="schedules"
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=ScheduleKind.choices, default=ScheduleKind.CRON)
    cron = models.CharField(
        max_length=200,
        blank=True,
        help_text="With kind cron: five fields, minute hour day-of-month month day-of-week "
        "(e.g. '0 9 * * 1-5' for 09:00 on weekdays), in time_zone.",
    )
    interval_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=f"With kind interval: seconds between runs "
        f"({schedule_times.MIN_INTERVAL_SECONDS} to {schedule_times.MAX_INTERVAL_SECONDS}).",
    )
    time_zone = models.CharField(
        max_length=64, default="UTC", help_text="The zone a cron expression is read in."
    )
    prompt = models.TextField(help_text="The prompt of every run it starts.")
    initiator = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The account the runs start as. It must hold agentruns.start_agentrun when "
        "each run starts; a start it may not make is skipped and logged.",
    )
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The pending due time; empty: worked out at the next tick (saving a changed "
        "timing in the admin empties it).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["configuration", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["configuration", "name"], name="runschedule_unique_name"
            ),
        ]
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="runschedule_due")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Refuses a timing no tick could follow: a cron expression or time zone that does not
        parse, an interval outside its bounds, or a kind without its field."""
        errors: dict[str, str] = {}
        if self.kind == ScheduleKind.CRON:
            problem = schedule_times.cron_problem(self.cron, self.time_zone)
            if problem is not None:
                key = "time_zone" if problem.startswith(repr(self.time_zone)) else "cron"
                errors[key] = problem
        elif self.kind == ScheduleKind.INTERVAL:
            problem = schedule_times.interval_problem(self.interval_seconds)
            if problem is not None:
                errors["interval_seconds"] = problem
        else:
            errors["kind"] = "Choose cron or interval."
        if not (self.prompt or "").strip():
            errors["prompt"] = "A schedule needs a prompt."
        if errors:
            raise ValidationError(errors)

    def timing(self) -> schedule_times.Timing:
        """The arguments ``schedule_times`` reads."""
        return {
            "kind": self.kind,
            "cron": self.cron,
            "interval_seconds": self.interval_seconds,
            "time_zone": self.time_zone,
        }


class StartOutcome(models.TextChoices):
    STARTED = "started", "started"
    SKIPPED = "skipped", "skipped"


class ScheduledStart(models.Model):
    """The one start of ``schedule`` for the due time ``scheduled_for``: its run, or why it was
    skipped. Unique per (schedule, scheduled_for): the idempotency of a tick."""

    schedule = models.ForeignKey(RunSchedule, on_delete=models.CASCADE, related_name="starts")
    scheduled_for = models.DateTimeField()
    outcome = models.CharField(max_length=8, choices=StartOutcome.choices)
    # A uuid, not a foreign key: the record outlives its run's purge (``services.retention``).
    run_uuid = models.UUIDField(null=True, blank=True)
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "scheduled_for"], name="scheduledstart_once_per_due_time"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.scheduled_for:%Y-%m-%d %H:%M}"


class EventSource(models.Model):
    """A configuration's signed-event endpoint, ``POST /api/events/<slug>/``: off unless its
    secret's variable is set."""

    configuration = models.OneToOneField(
        "agentruns.AgentConfiguration", on_delete=models.CASCADE, related_name="event_source"
    )
    secret_env = models.CharField(
        max_length=100,
        help_text="Name of the environment variable holding the signing secret (never the "
        "secret itself), starting with an allowed prefix (by default LEASEHOLD_). Unset or "
        "empty: the endpoint answers 404.",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The account events act as: runs start as it (it needs "
        "agentruns.start_agentrun) and input is delivered as it (it needs "
        "agentruns.decide_agentrun), checked at every event.",
    )
    prompt = models.TextField(
        help_text="The instructions of a run an event starts; the event's data follows them, "
        "delimited as data."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"events of {self.configuration}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        problem = secret_env_problem(self.secret_env)
        if problem is not None:
            errors["secret_env"] = problem
        if not (self.prompt or "").strip():
            errors["prompt"] = "Runs started by events need instructions."
        if errors:
            raise ValidationError(errors)


class EventAction(models.TextChoices):
    STARTED = "started", "started a run"
    INPUT = "input", "delivered input"


class ReceivedEvent(models.Model):
    """One accepted event: the run it started or gave input to. Unique per (configuration,
    event id): a replay finds it and changes nothing. A run started with a correlation key is
    found by it (unique per configuration among starts)."""

    configuration = models.ForeignKey(
        "agentruns.AgentConfiguration", on_delete=models.CASCADE, related_name="+"
    )
    event_id = models.CharField(max_length=EVENT_KEY_MAX)
    body_sha256 = models.CharField(max_length=64)
    action = models.CharField(max_length=8, choices=EventAction.choices)
    correlation_key = models.CharField(max_length=EVENT_KEY_MAX, blank=True)
    # A uuid, not a foreign key: the replay guard outlives its run's purge.
    run_uuid = models.UUIDField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["configuration", "event_id"], name="receivedevent_once_per_id"
            ),
            models.UniqueConstraint(
                fields=["configuration", "correlation_key"],
                condition=Q(action="started") & ~Q(correlation_key=""),
                name="receivedevent_one_run_per_key",
            ),
        ]

    def __str__(self) -> str:
        return self.event_id
