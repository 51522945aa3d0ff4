"""The vocabulary of runs (docs/design.md §1): the ``TextChoices`` their columns take — provider,
tool effect, status, termination reason, event kind, approval-timeout action, segment — and the
status and effect sets the rest of the code tests against.

Choices that belong to one side table (``McpTransport``, ``NotificationChannel``, ``SpendScope``)
live beside their model.
"""

from __future__ import annotations

from django.db import models


class Provider(models.TextChoices):
    SCRIPTED = "scripted", "Scripted (plays a fixed list of turns)"
    OPENAI = "openai", "OpenAI-compatible chat completions"
    ANTHROPIC = "anthropic", "Anthropic Messages API"


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
    BAD_RESPONSE = "bad_response", "the provider's reply was malformed or could not be stored"
    BAD_OUTPUT = "bad_output", "its final answer did not match the output schema"
    EXTERNAL_FAILED = "external_failed", "its external agent loop reported a failure"


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
    # Nobody decided before the deadline: the wait was handed to the escalation group, with a
    # second deadline (``transitions.escalation``).
    ESCALATION = "escalation", "escalation"
    # A final answer did not match the configuration's ``output_schema``: the model is told what
    # failed (``structured_output``) and answers once more.
    OUTPUT_CHECK = "output_check", "output check"


class ApprovalTimeoutAction(models.TextChoices):
    """What happens to a run still waiting for approval or input at its deadline."""

    DENY = "deny", "deny the turn (the model is told it expired) and continue the run"
    FAIL = "fail", "end the run failed (approval_expired)"
    ESCALATE = "escalate", "hand it to the escalation group, with a second deadline"


#: What may end a wait for good (``on_escalation_timeout``: after an escalation, never another).
FINAL_TIMEOUT_ACTIONS = (ApprovalTimeoutAction.DENY, ApprovalTimeoutAction.FAIL)


class Segment(models.TextChoices):
    INTERACTIVE = "interactive", "interactive"
    RESUME = "resume", "resume"
    WORKER = "worker", "worker"
