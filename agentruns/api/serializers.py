"""Request and response shapes of the API. Responses never expose the raw loop state."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from agentruns import budgets
from agentruns.authority import escalation_of
from agentruns.models import (
    DEADLINE_STATUSES,
    AgentRun,
    AgentRunEvent,
    ApprovalTimeoutAction,
    Status,
)
from agentruns.run_counts import run_counts
from agentruns.tools.origin_lookup import tool_origin
from agentruns.tools.shown import shown_turn
from agentruns.turns import (
    INPUT,
    RECONCILIATION,
    read_pending_turn,
    waits_for_a_human,
)
from agentruns.versions import version_number

MODE_CHOICES = [("sync", "sync"), ("queued", "queued")]
DECISION_MODE_CHOICES = [("inline", "inline"), ("queued", "queued")]
EVENTS_LIMIT = 1000


# --- Errors ------------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    """Every refusal: a stable code, a message, and optional details (e.g. ``errors``)."""

    code = serializers.CharField()
    message = serializers.CharField()
    errors = serializers.JSONField(required=False)  # type: ignore[assignment]  # a declared field, not .errors


@extend_schema_field(
    {
        "type": "array",
        "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "description": "The keys from the submitted values to the value that failed: strings "
        "for object properties, integers for array items; [] for the values themselves.",
    }
)
class SchemaPathField(serializers.JSONField):
    pass


class SchemaErrorSerializer(serializers.Serializer):
    path = SchemaPathField()
    message = serializers.CharField()


class InvalidInputSerializer(serializers.Serializer):
    """422 ``invalid_input``: the values break the input schema. ``errors`` are sorted by path,
    then message; a capped list (``agentruns.tools.schemas.schema_errors``)."""

    code = serializers.CharField()
    message = serializers.CharField()
    errors = SchemaErrorSerializer(many=True)  # type: ignore[assignment]  # a declared field, not .errors


# --- Runs ------------------------------------------------------------------------------------


class RunStartSerializer(serializers.Serializer):
    configuration = serializers.SlugField(help_text="The slug of an active configuration.")
    prompt = serializers.CharField(trim_whitespace=False)
    mode = serializers.ChoiceField(choices=MODE_CHOICES, default="sync")
    script = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        allow_null=True,
        help_text="Turns for the scripted provider (refused for other providers).",
    )


class RunQueuedSerializer(serializers.Serializer):
    uuid = serializers.UUIDField()
    status = serializers.ChoiceField(choices=Status.choices)


class ChangeSerializer(serializers.Serializer):
    field = serializers.CharField()
    before = serializers.JSONField(allow_null=True, help_text="null: it does not exist yet.")
    after = serializers.JSONField(allow_null=True)


class PreviewSerializer(serializers.Serializer):
    """What a write will change, made when the turn suspended (covered by the digest)."""

    summary = serializers.CharField()
    target = serializers.CharField(allow_null=True)
    changes = ChangeSerializer(many=True, help_text="At most 20; long values cut with a mark.")


class ServerOriginSerializer(serializers.Serializer):
    name = serializers.CharField()
    transport = serializers.ChoiceField(choices=["streamable_http", "stdio"])
    endpoint = serializers.CharField(help_text="The command (stdio) or the URL (streamable HTTP).")
    enabled = serializers.BooleanField()


class ToolOriginSerializer(serializers.Serializer):
    """Where the call's tool comes from, read when the turn is shown (a call re-reads its server
    when it runs) and covered by ``turn_digest``: a decision is taken only while it is still what
    would run. ``hints`` are *declared by the server, not verified*: they decide nothing."""

    description = serializers.CharField(
        allow_blank=True, help_text="The tool's own description (at most 1,000 characters)."
    )
    source = serializers.ChoiceField(  # type: ignore[assignment]  # a declared field, not .source
        choices=["local", "mcp", "unknown"],
        help_text="unknown: no such tool is registered now.",
    )
    server = ServerOriginSerializer(
        allow_null=True, help_text="mcp: the MCP server the call goes to; null otherwise."
    )
    hints = serializers.DictField(
        child=serializers.CharField(),
        help_text="mcp: the hints the server declares (readOnlyHint, …), as text. Declared by "
        "the server, not verified: they never decide approval or the effect.",
    )
    hints_note = serializers.CharField(
        allow_blank=True, help_text='"declared by the server, not verified" when there are hints.'
    )
    read_only_by_operator = serializers.BooleanField(
        help_text="mcp: the operator listed the tool read-only on its server row (it runs "
        "without approval and unfenced)."
    )


class CallEditSerializer(serializers.Serializer):
    original_arguments = serializers.JSONField(help_text="The arguments the model proposed.")
    editor = serializers.CharField(help_text="Who edited them (a username).")
    editor_id = serializers.IntegerField(allow_null=True)


class CallSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    arguments = serializers.JSONField(
        help_text="The arguments, keys in the order the model sent them."
    )
    effect = serializers.CharField(
        help_text="approval and input: the effect the call would run with now (its tool's, or "
        "non_idempotent_write for a tool the run cannot use); reconciliation: the effect its "
        "fence stamped. Covered by turn_digest."
    )
    tool = ToolOriginSerializer()
    preview = PreviewSerializer(
        allow_null=True,
        help_text="approval: what the write will change; null when its tool declares no "
        "preview or the preview failed (preview_failed names the exception class).",
    )
    preview_failed = serializers.CharField(allow_null=True)
    edit = CallEditSerializer(
        allow_null=True,
        help_text="approval: a person edited the arguments (arguments are the edited ones); "
        "null: as the model proposed them.",
    )


class CheckStatusSerializer(serializers.Serializer):
    """Where the tool's automatic check of an in-doubt call stands (docs/design.md §9.2)."""

    state = serializers.ChoiceField(
        choices=["scheduled", "checking", "retrying", "left_to_person"],
        help_text="scheduled / checking / retrying: the check may still settle the run (a "
        "person may decide first); left_to_person: no more checks, a person decides.",
    )
    attempts = serializers.IntegerField(help_text="Checks started so far.")
    limit = serializers.IntegerField(help_text="Checks allowed in all (RECONCILE_CHECKS).")
    answer = serializers.CharField(
        allow_blank=True,
        help_text="The last answer that settled nothing: unknown, error, timeout or refused "
        "(a verdict the run could not take); empty before the first.",
    )
    evidence = serializers.CharField(allow_blank=True, help_text="What the check said.")
    started_at = serializers.DateTimeField(allow_null=True)
    answered_at = serializers.DateTimeField(allow_null=True)
    next_at = serializers.DateTimeField(allow_null=True, help_text="When the next check is due.")


class PendingTurnSerializer(serializers.Serializer):
    """What a human decides on. ``calls`` holds the calls of the turn (approval), the call asking
    for input (input) or the call in flight when its segment died (reconciliation). A stored turn
    that cannot be read (malformed, or its digest does not match what it shows) is ``unreadable``
    with the ``problem``: it has no controls anywhere and can only be cancelled."""

    kind = serializers.ChoiceField(choices=["approval", "input", "reconciliation", "unreadable"])
    turn_digest = serializers.CharField(allow_blank=True)
    calls = CallSerializer(many=True)
    input_schema = serializers.JSONField(allow_null=True)
    field_order = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="input: the schema's properties in the order the tool declared them "
        "(PostgreSQL's jsonb does not keep the schema's key order).",
    )
    idempotency_key = serializers.CharField(allow_null=True)
    problem = serializers.CharField(
        allow_blank=True, help_text="unreadable: why the stored turn cannot be decided."
    )
    reason = serializers.CharField(
        allow_blank=True,
        help_text="reconciliation: why the outcome is unknown when the tool said so (a timeout "
        "after the request was sent); empty when the segment died.",
    )
    check = CheckStatusSerializer(
        allow_null=True,
        help_text="reconciliation: the tool's automatic check, when its tool declares one.",
    )
    deadline = serializers.DateTimeField(
        allow_null=True,
        help_text="approval and input: when the wait ends if nobody decides (the database "
        "clock, fixed when the run started waiting); null: no deadline. Never for a "
        "reconciliation.",
    )
    on_deadline = serializers.ChoiceField(
        choices=["deny", "fail", "escalate"],
        allow_null=True,
        help_text="What happens at the deadline: deny (the model is told it expired and the run "
        "continues), fail (the run ends failed / approval_expired) or escalate (the wait is "
        "handed to the configuration's escalation group, with a second deadline); null: no "
        "deadline.",
    )
    escalated_to = serializers.CharField(
        allow_null=True,
        help_text="approval and input: the group the wait was escalated to at its first "
        "deadline (its members may decide it now); null: not escalated.",
    )
    escalated_at = serializers.DateTimeField(
        allow_null=True, help_text="When the wait was escalated; null: not escalated."
    )


def pending_turn_view(run: AgentRun) -> dict[str, Any] | None:
    """The pending turn as clients see it (read by ``agentruns.turns`` and shown by
    ``agentruns.tools.shown``, exactly as the inbox shows it: ``turn_digest`` covers every field
    of every call given here); ``None`` unless the run waits for a human."""
    if not waits_for_a_human(run):
        return None
    pending = shown_turn(run, read_pending_turn(run))
    return {
        "kind": pending.kind,
        "turn_digest": pending.turn_digest,
        "calls": [
            {
                "id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "effect": c.effect,
                "tool": (c.origin or tool_origin(c.name)).to_json(),
                "preview": c.preview.to_json() if c.preview is not None and c.preview.ok else None,
                "preview_failed": c.preview.failed
                if c.preview is not None and c.preview.failed
                else None,
                "edit": c.edit.to_json() if c.edit is not None else None,
            }
            for c in pending.calls
        ],
        "input_schema": pending.input_schema if pending.kind == INPUT else None,
        "field_order": list(pending.field_order) if pending.kind == INPUT else None,
        "idempotency_key": pending.idempotency_key if pending.kind == RECONCILIATION else None,
        "problem": pending.problem,
        "reason": pending.reason,
        "check": pending.check.to_json() if pending.check is not None else None,
        **_deadline_view(run),
    }


def _deadline_view(run: AgentRun) -> dict[str, Any]:
    """The approval deadline of a run waiting for approval or input (docs/design.md §5.11)."""
    group = escalation_of(run)
    at = run.escalated_at if group is not None else None
    escalated = {
        "escalated_to": group.name if group is not None else None,
        "escalated_at": serializers.DateTimeField().to_representation(at) if at else None,
    }
    if run.status not in DEADLINE_STATUSES or run.approval_deadline is None:
        return {"deadline": None, "on_deadline": None, **escalated}
    action = run.approval_timeout_action
    return {
        "deadline": serializers.DateTimeField().to_representation(run.approval_deadline),
        "on_deadline": action if action in ApprovalTimeoutAction.values else "fail",
        **escalated,
    }


class CountField(serializers.IntegerField):
    """One of a run's counts so far (``agentruns.run_counts.RunCounts``), for every status: a
    run that waits or was cancelled counts the rounds its events record."""

    def __init__(self, counter: str, **kwargs: Any) -> None:
        self.counter = counter
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, value: Any) -> int:
        return int(getattr(run_counts(value), self.counter))


class RunSerializer(serializers.Serializer):
    """A run: every column of docs/design.md §1.2 except the raw state (``request``,
    ``loop_state``)."""

    uuid = serializers.UUIDField()
    configuration = serializers.SlugField(source="configuration.slug")
    # The configuration version the run pinned when it started (docs/configuration-versions.md).
    configuration_version = serializers.SerializerMethodField()
    initiator = serializers.CharField(source="initiator.get_username", allow_null=True)
    prompt = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    termination_reason = serializers.CharField(allow_blank=True)
    claimed_by = serializers.CharField(allow_blank=True)
    lease_expires = serializers.DateTimeField(allow_null=True)
    lease_epoch = serializers.IntegerField()
    pending_effect = serializers.CharField(allow_blank=True)
    pending_call = serializers.JSONField(allow_null=True)
    requeue_count = serializers.IntegerField()
    pending_turn = serializers.SerializerMethodField()
    output = serializers.CharField(allow_blank=True)
    # The final answer as the JSON value it validated as, when the configuration sets an
    # ``output_schema`` (``services.runtime.structured_output``); null otherwise.
    output_object = serializers.JSONField(allow_null=True)
    error = serializers.JSONField()
    # Rounds and tokens so far, whatever the status (``agentruns.run_counts``).
    prompt_tokens = CountField("prompt_tokens")
    completion_tokens = CountField("completion_tokens")
    total_tokens = CountField("total_tokens")
    # What the run's model calls cost so far, a decimal string in ``currency``
    # (AGENTRUNS["COST_CURRENCY"]); "0.000000" for an unpriced configuration.
    cost = serializers.DecimalField(max_digits=14, decimal_places=6, coerce_to_string=True)
    currency = serializers.SerializerMethodField()
    iterations = CountField("rounds")
    truncated = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField()

    @extend_schema_field(PendingTurnSerializer(allow_null=True))
    def get_pending_turn(self, run: AgentRun) -> dict[str, Any] | None:
        return pending_turn_view(run)

    def get_currency(self, run: AgentRun) -> str:
        return budgets.currency()

    @extend_schema_field(OpenApiTypes.INT)
    def get_configuration_version(self, run: AgentRun) -> int:
        return version_number(run)


#: A run list cuts each run's prompt and output here; its detail has them whole.
LIST_TEXT_CHARS = 500


class RunSummarySerializer(RunSerializer):
    """A run in a list: a run's fields, with ``prompt`` and ``output`` cut at
    ``LIST_TEXT_CHARS`` characters (``prompt_truncated``, ``output_truncated`` say so) and
    without ``output_object``. ``GET /api/runs/<uuid>/`` has them whole."""

    output_object = None  # type: ignore[assignment]  # in a run's detail only

    prompt_truncated = serializers.SerializerMethodField()
    output_truncated = serializers.SerializerMethodField()

    def get_prompt_truncated(self, run: AgentRun) -> bool:
        return len(run.prompt) > LIST_TEXT_CHARS

    def get_output_truncated(self, run: AgentRun) -> bool:
        return len(run.output) > LIST_TEXT_CHARS

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        data["prompt"] = data["prompt"][:LIST_TEXT_CHARS]
        data["output"] = data["output"][:LIST_TEXT_CHARS]
        return data


MAX_PAGE_SIZE = 200


class QuerySerializer(serializers.Serializer):
    """A query string's parameters. DRF reads an empty value of an optional field as absent
    (``?status=`` would list every run, ``?after=`` start from the first event): refused here
    like any other invalid value."""

    def to_internal_value(self, data: Any) -> Any:
        names = [str(field.field_name) for field in self.fields.values()]
        blank = {
            name: ["This field may not be blank."]
            for name in names
            if hasattr(data, "getlist") and name in data and "" in data.getlist(name)
        }
        if blank:
            raise serializers.ValidationError(blank)
        return super().to_internal_value(data)


class RunFilterSerializer(QuerySerializer):
    """The run list's query: its filters and its page. The paginator reads ``page`` and
    ``page_size`` again; they are checked here first so a bad value is a 400 like any other."""

    status = serializers.ChoiceField(choices=Status.choices, required=False)
    configuration = serializers.SlugField(required=False, help_text="A configuration's slug.")
    page = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="A page number; a page past the last one answers 404.",
    )
    page_size = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text=f"Runs per page (default 50); a larger value than {MAX_PAGE_SIZE} is capped.",
    )


# --- Events ----------------------------------------------------------------------------------


class EventsQuerySerializer(QuerySerializer):
    after = serializers.IntegerField(
        min_value=-1,
        max_value=2**31 - 1,  # a sequence is a 32-bit integer; a larger value cannot be compared
        default=-1,
        help_text="Only events with a greater sequence.",
    )


class EventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.get_username", allow_null=True, read_only=True)

    class Meta:
        model = AgentRunEvent
        fields = [
            "sequence",
            "kind",
            "segment",
            "lease_epoch",
            "duration_ms",
            "payload",
            "actor",
            "created_at",
        ]


class CancelledSerializer(serializers.Serializer):
    cancelled = serializers.BooleanField()
