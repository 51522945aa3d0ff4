"""Agent configurations, runs and their append-only event stream (docs/design.md §1).

Status, lease and fence columns are written only by ``agentruns.transitions``; nothing else may
``save()`` an existing run.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from agentruns.secrets import secret_env_problem


class Provider(models.TextChoices):
    SCRIPTED = "scripted", "Scripted (plays a fixed list of turns)"
    OPENAI = "openai", "OpenAI-compatible chat completions"


class Effect(models.TextChoices):
    READ = "read", "read"
    IDEMPOTENT_WRITE = "idempotent_write", "idempotent write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write", "non-idempotent write"


WRITE_EFFECTS = frozenset({Effect.IDEMPOTENT_WRITE, Effect.NON_IDEMPOTENT_WRITE})


class Status(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval", "waiting for approval"
    WAITING_FOR_INPUT = "waiting_for_input", "waiting for input"
    WAITING_FOR_RECONCILIATION = "waiting_for_reconciliation", "waiting for reconciliation"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


TERMINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
WAITING_STATUSES = frozenset(
    {
        Status.WAITING_FOR_APPROVAL,
        Status.WAITING_FOR_INPUT,
        Status.WAITING_FOR_RECONCILIATION,
    }
)


#: The states an approval deadline applies to (docs/design.md §5.11): never a run in doubt.
DEADLINE_STATUSES = frozenset({Status.WAITING_FOR_APPROVAL, Status.WAITING_FOR_INPUT})


class TerminationReason(models.TextChoices):
    COMPLETED = "completed", "completed"
    MAX_ITERATIONS = "max_iterations", "reached the round cap"
    PROVIDER_FAILED = "provider_failed", "the provider failed"
    TOOL_FAILED = "tool_failed", "a tool failed"
    NOT_RETRYABLE = "not_retryable", "failed with an error that is not retried"
    RETRIES_EXHAUSTED = "retries_exhausted", "used its whole retry budget"
    NOT_RESUMABLE = "not_resumable", "its stored state could not be rehydrated"
    ABANDONED = "abandoned", "the client went away mid-stream"
    RECONCILED_ABANDONED = "reconciled_abandoned", "abandoned by an operator during reconciliation"
    CANCELLED = "cancelled", "cancelled"
    INTERNAL_ERROR = "internal_error", "an unexpected error inside Leasehold"
    APPROVAL_EXPIRED = "approval_expired", "nobody decided before its approval deadline"
    BUDGET_EXHAUSTED = "budget_exhausted", "its daily budget was spent"


class EventKind(models.TextChoices):
    REQUEST = "request", "request"
    LLM = "llm", "model answer"
    TOOL = "tool", "tool call"
    APPROVAL = "approval", "approval decision"
    INPUT = "input", "human input"
    RECONCILIATION = "reconciliation", "reconciliation"
    LEASE = "lease", "lease"
    REAPER = "reaper", "reaper"
    CANCEL = "cancel", "cancel"
    # The segment refused to let a decision run: what would run is not what was approved.
    VERIFICATION = "verification", "verification"
    # An unexpected exception ended the segment (its type and message; the traceback is logged).
    ERROR = "error", "error"
    # A non-idempotent write's outcome is unknown (its tool said so): the run waits for a person.
    IN_DOUBT = "in_doubt", "outcome unknown"
    # A tool's automatic check of an in-doubt write answered unknown, failed or timed out; a
    # landed / not landed answer is a ``reconciliation`` event (``by: "check"``) instead.
    CHECK = "check", "automatic check"
    # A provider call was refused before it was made: a daily budget is spent (``budgets``).
    BUDGET = "budget", "budget"


class ApprovalTimeoutAction(models.TextChoices):
    """What happens to a run still waiting for approval or input at its deadline."""

    DENY = "deny", "deny the turn (the model is told it expired) and continue the run"
    FAIL = "fail", "end the run failed (approval_expired)"


class Segment(models.TextChoices):
    INTERACTIVE = "interactive", "interactive"
    RESUME = "resume", "resume"
    WORKER = "worker", "worker"


class AgentConfiguration(models.Model):
    """What an agent is: its provider, model, prompt, tools and limits. Edited in the admin."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.SCRIPTED)
    model = models.CharField(max_length=200, blank=True)
    base_url = models.URLField(
        blank=True, help_text="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1"
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text=(
            "Name of the environment variable holding the API key (never the key itself), "
            "starting with an allowed prefix (AGENTRUNS['SECRET_ENV_PREFIXES'], by default "
            "LEASEHOLD_)."
        ),
    )
    timeout_seconds = models.PositiveIntegerField(default=30, help_text="Provider call timeout.")
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="Allowed tool names; empty = all.")
    max_iterations = models.PositiveSmallIntegerField(
        default=10, help_text="Model rounds before the run is truncated (capped by MAX_ITERATIONS)."
    )
    require_second_approver = models.BooleanField(
        default=False, help_text="Four-eyes: the initiator may deny but not approve their own run."
    )
    preview_is_snapshot = models.BooleanField(
        default=False,
        help_text="Off (the default): before an approved write with a preview runs, its preview "
        "is made again, and if it changed the call does not run and waits for approval again. "
        "On: the preview is only a snapshot captured when the run paused.",
    )
    approver_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        # A group named here cannot be deleted: losing it must not lift the restriction.
        on_delete=models.PROTECT,
        related_name="+",
        help_text=(
            "Only members of this group may approve this configuration's runs or say whether an "
            "in-doubt call landed (beside the permissions those need). Empty: no group needed."
        ),
    )
    approval_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text=(
            "How long a run may wait for approval or input (e.g. 00:30:00 for 30 minutes, "
            "1 00:00:00 for a day); empty: no deadline. Fixed when the run starts waiting; the "
            "reaper settles it once passed (on_approval_timeout)."
        ),
    )
    on_approval_timeout = models.CharField(
        max_length=8,
        choices=ApprovalTimeoutAction.choices,
        default=ApprovalTimeoutAction.DENY,
        help_text="What happens at the deadline: deny the turn and continue, or fail the run.",
    )
    script = models.JSONField(
        default=list, blank=True, help_text="Turns for the scripted provider."
    )
    notify_webhook_url = models.URLField(
        max_length=2048,
        blank=True,
        help_text=(
            "Optional: when a run of this configuration waits for a person, POST a "
            'Slack-compatible {"text": …} here (at most once per AGENTRUNS NOTIFY_INTERVAL). '
            "Its host must be in AGENTRUNS['WEBHOOK_ALLOWLIST']."
        ),
    )
    is_active = models.BooleanField(default=True)
    # Cost (agentruns.budgets): prices in AGENTRUNS["COST_CURRENCY"]; empty = not priced.
    price_per_million_prompt_tokens = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Price of a million prompt tokens (AGENTRUNS['COST_CURRENCY']); empty: unpriced.",
    )
    price_per_million_completion_tokens = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Price of a million completion tokens; empty: unpriced.",
    )
    daily_budget = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Most this configuration's runs may spend per UTC day; empty: no budget. A run "
        "over it ends failed (budget exhausted) before its next model call.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(price_per_million_prompt_tokens__gte=0)
                & Q(price_per_million_completion_tokens__gte=0)
                & Q(daily_budget__gte=0),
                name="agentconfiguration_cost_not_negative",
                violation_error_message="Prices and budgets cannot be negative.",
            )
        ]

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.api_key_env:
            problem = secret_env_problem(self.api_key_env)
            if problem is not None:
                errors["api_key_env"] = problem
        if self.approval_timeout is not None and self.approval_timeout <= timedelta(0):
            errors["approval_timeout"] = "A deadline must be a positive duration (or empty: none)."
        if self.on_approval_timeout not in ApprovalTimeoutAction.values:
            errors["on_approval_timeout"] = "Choose deny or fail."
        if self.notify_webhook_url:
            from agentruns import conf
            from agentruns.outbound import WebhookRefused, webhook_target

            try:
                webhook_target(self.notify_webhook_url, list(conf.get("WEBHOOK_ALLOWLIST")))
            except WebhookRefused as refused:
                errors["notify_webhook_url"] = str(refused)
        if errors:
            raise ValidationError(errors)


class AgentRun(models.Model):
    """One agent run. Its status, claim, lease and fence change only through transitions."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    configuration = models.ForeignKey(
        AgentConfiguration, on_delete=models.PROTECT, related_name="runs"
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
    # The sequence the run's next event takes (its last event's + 1; 0 with none): advanced by
    # the same guarded statement or transaction that appends events, so no writer reads
    # ``MAX(sequence)`` (docs/design.md §1.10).
    next_sequence = models.PositiveIntegerField(default=0, editable=False)

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
        ]

    def __str__(self) -> str:
        return f"{self.uuid} ({self.status})"

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
    # The tamper-evident chain (agentruns.ledger): the previous event's hash and this one's.
    prev_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    hash = models.CharField(max_length=64, blank=True, default="", editable=False)

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


class McpTransport(models.TextChoices):
    STREAMABLE_HTTP = "streamable_http", "Streamable HTTP (a URL)"
    STDIO = "stdio", "stdio (a local command; only when AGENTRUNS['MCP_STDIO_ALLOWED'] is on)"


# A server name becomes part of every tool name ``mcp__<server>__<tool>`` (at most 64 characters,
# letters, digits, ``_`` and ``-``); ``__`` is the separator, so a name may neither contain it
# nor end with ``_``.
MCP_SERVER_NAME_RE = r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_|$))*$"
MCP_SERVER_NAME_MAX = 24


class McpServer(models.Model):
    """A remote tool server (MCP) registered by an operator. Edited in the admin (docs/design.md
    §4.5).

    Every tool it offers is a ``non_idempotent_write``, except those the operator lists in
    ``read_only_tools`` (reads: no approval, no fence); ``requires_approval`` is read
    fail-closed through ``approval_required``. Secrets never live here: ``headers_env`` names the
    environment variables that hold them (allowed names only, ``agentruns.secrets``).
    ``tools_snapshot`` and ``last_synced_at`` are written by ``agentruns.services.mcp_sync``
    (the ``sync_mcp_tools`` command, the admin action).
    """

    name = models.CharField(
        max_length=MCP_SERVER_NAME_MAX,
        unique=True,
        validators=[
            RegexValidator(
                MCP_SERVER_NAME_RE,
                "Letters, digits, '-' and single '_' only (tools are named mcp__<server>__<tool>).",
            )
        ],
        help_text="Tools appear as mcp__<name>__<tool>.",
    )
    transport = models.CharField(
        max_length=20, choices=McpTransport.choices, default=McpTransport.STREAMABLE_HTTP
    )
    url = models.URLField(
        max_length=500, blank=True, help_text="Streamable HTTP endpoint, e.g. http://host/mcp"
    )
    command = models.CharField(
        max_length=1000,
        blank=True,
        help_text="stdio: the command line that starts the server (split like a shell would).",
    )
    enabled = models.BooleanField(default=True)
    requires_approval = models.BooleanField(
        null=True,
        default=True,
        help_text=(
            "On (the default): every call of this server's tools waits for a staff decision. "
            "Only an explicit 'No' lets them run unattended, on the first pass of a run (still "
            "fenced). Unknown counts as on."
        ),
    )
    timeout_seconds = models.PositiveIntegerField(
        default=20,
        validators=[MinValueValidator(1)],
        help_text="Per call (connect + call); capped by AGENTRUNS['TOOL_TIMEOUT_SECONDS'].",
    )
    allowed_tools = models.JSONField(
        default=list,
        blank=True,
        help_text="The server's tool names this deployment may use; empty = all discovered.",
    )
    read_only_tools = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            'Tools you declare read-only, e.g. ["git_status", "git_log"]: they run without '
            "approval and unfenced. Every other tool is a non-idempotent write. The server's own "
            "hints (readOnlyHint) never decide this."
        ),
    )
    headers_env = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            'HTTP headers from the environment: {"Authorization": "LEASEHOLD_MY_SERVER_AUTH"} '
            "sends the value of $LEASEHOLD_MY_SERVER_AUTH. Never put a secret here. Names start "
            "with an allowed prefix (AGENTRUNS['SECRET_ENV_PREFIXES'], by default LEASEHOLD_)."
        ),
    )
    tools_snapshot = models.JSONField(
        default=list,
        blank=True,
        help_text="Discovered tools: name, registered_name, description, input_schema, hints.",
    )
    last_synced_at = models.DateTimeField(null=True, blank=True)
    last_sync_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    @property
    def approval_required(self) -> bool:
        """Fail closed: only an explicit ``False`` switches approval off."""
        return self.requires_approval is not False

    def clean(self) -> None:
        from agentruns import conf

        errors: dict[str, str] = {}
        if self.transport == McpTransport.STREAMABLE_HTTP:
            if not self.url:
                errors["url"] = "A streamable HTTP server needs a URL."
        elif self.transport == McpTransport.STDIO:
            if not conf.get("MCP_STDIO_ALLOWED"):
                errors["transport"] = "stdio servers are off (AGENTRUNS['MCP_STDIO_ALLOWED'])."
            elif not self.command.strip():
                errors["command"] = "A stdio server needs a command."
        else:
            errors["transport"] = f"Unknown transport {self.transport!r}."
        if not isinstance(self.allowed_tools, list) or not all(
            isinstance(t, str) and t for t in self.allowed_tools
        ):
            errors["allowed_tools"] = "A JSON list of tool names."
        if not isinstance(self.read_only_tools, list) or not all(
            isinstance(t, str) and t for t in self.read_only_tools
        ):
            errors["read_only_tools"] = "A JSON list of tool names."
        if not isinstance(self.headers_env, dict) or not all(
            isinstance(h, str)
            and re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", h)
            and isinstance(v, str)
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
            for h, v in (self.headers_env.items() if isinstance(self.headers_env, dict) else [])
        ):
            errors["headers_env"] = (
                'A JSON object {"Header-Name": "ENV_VAR_NAME"}: the name of an environment '
                "variable, never the secret itself."
            )
        else:
            refused = [
                f"{header}: {problem}"
                for header, variable in self.headers_env.items()
                if (problem := secret_env_problem(variable)) is not None
            ]
            if refused:
                errors["headers_env"] = " ".join(refused)
        if errors:
            raise ValidationError(errors)


class Counter(models.Model):
    """A running total for ``/metrics`` that no cheap query can give (the reaper's verdicts by
    rule): one row per name and label set, raised by ``UPDATE … SET value = value + n``."""

    name = models.CharField(max_length=64)
    # The label set, canonical: ``key=value`` pairs sorted by key, comma-separated.
    labels = models.CharField(max_length=255, blank=True)
    value = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "labels"], name="counter_name_labels")
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} {self.value}"


class NotificationChannel(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook"


class NotificationState(models.Model):
    """Who was told what (``agentruns.services.notifications``): one row per person (email) or
    per configuration (its webhook).

    ``last_sent_at`` (database clock) is claimed by one guarded ``UPDATE`` before a digest is
    sent, so at most one digest per ``NOTIFY_INTERVAL`` leaves for a recipient whatever the
    number of concurrent passes; ``told`` holds the keys (run id, status, turn digest) of the
    waits already announced that were still waiting at the last digest.
    """

    channel = models.CharField(max_length=16, choices=NotificationChannel.choices)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
    )
    configuration = models.OneToOneField(
        AgentConfiguration, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # The token of the last claim: only that claim's pass records what it told.
    claim = models.CharField(max_length=32, blank=True)
    told = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(channel="email", user__isnull=False, configuration__isnull=True)
                    | models.Q(channel="webhook", user__isnull=True, configuration__isnull=False)
                ),
                name="notificationstate_one_recipient",
            )
        ]

    def __str__(self) -> str:
        who = f"user {self.user_id}" if self.user_id else f"configuration {self.configuration_id}"
        return f"{self.channel} to {who}"


class SpendScope(models.TextChoices):
    CONFIGURATION = "configuration", "configuration"
    USER = "user", "user"


class SpendDay(models.Model):
    """What was spent on model calls in one UTC day (the database's clock), per configuration
    (``key`` = its id) and per initiator (``key`` = the user's id): the ledger the daily budgets
    are checked against and ``/metrics`` sums (``agentruns.budgets``; docs/design.md §14).

    Written only by ``agentruns.budgets``, by ``INSERT … ON CONFLICT DO UPDATE`` that adds to
    the stored values: a charge in the same transaction as the events that record the calls, a
    reservation of ``largest`` before a call when a budget applies. ``key`` is a plain id, not a
    foreign key, so a deleted user or configuration keeps its history.
    """

    day = models.DateField()
    scope = models.CharField(max_length=16, choices=SpendScope.choices)
    key = models.BigIntegerField()
    amount = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    calls = models.PositiveIntegerField(default=0)
    # The largest single call charged today: what a reservation holds back while a call is in
    # flight (budgets.reserve).
    largest = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    # Calls whose provider reported no token usage (charged 0).
    unknown_usage_calls = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "scope", "key"], name="spendday_day_scope_key")
        ]
        indexes = [models.Index(fields=["scope", "key", "day"], name="spendday_scope_key_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.scope}={self.key}: {self.amount}"
