"""Agent configurations, runs and their append-only event stream (docs/design.md §1).

Status, lease and fence columns are written only by ``agentruns.transitions``; nothing else may
``save()`` an existing run.
"""

from __future__ import annotations

import re
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
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
    script = models.JSONField(
        default=list, blank=True, help_text="Turns for the scripted provider."
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        if self.api_key_env:
            problem = secret_env_problem(self.api_key_env)
            if problem is not None:
                raise ValidationError({"api_key_env": problem})


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
