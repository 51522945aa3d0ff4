"""The shape of each event kind's payload (``AgentRunEvent.payload``), one ``TypedDict`` per
``EventKind``, as the code that records the event builds it (the builder is named on each class).

Readers take these shapes as a promise about new events only: an event stored by an older
version may lack a key, and a corrupt one may hold anything, so every key is optional here and a
reader still checks a value's type before it relies on it (``agentruns.event_summaries``).
Values a model, a tool or a remote server chose (a tool's name, its arguments, an answer, an
error message) are plain text to every screen: escaped where they are shown.
"""

from __future__ import annotations

from typing import Any, TypedDict

from agentruns.models import EventKind


class ProposedCall(TypedDict, total=False):
    """A call an ``llm`` event proposes."""

    id: str
    name: str
    arguments: Any


class CallRef(TypedDict, total=False):
    """A call an ``approval`` event decided; per call (``per_call``) with its verdict, and the
    reason, the answer or the edited arguments with the model's original ones
    (``services.call_decisions.verdicts_payload``)."""

    id: str
    name: str
    verdict: str  # approve, deny, answer, edit
    reason: str
    answer: Any
    arguments: Any
    original_arguments: Any


class EditPayload(TypedDict, total=False):
    """A ``tool`` event's ``edit``: the call ran with arguments a person edited
    (``tool_step.edited_marks``)."""

    editor: str
    editor_id: int | None
    original_arguments: Any


class AuthorityPayload(TypedDict, total=False):
    """``Authority.as_payload()``: the permissions and group a decision was taken under."""

    permissions: list[str]
    group: str | None


class ErrorPayload(TypedDict, total=False):
    """An error as runs store it (``AgentRun.error``): a type and a message. Also the whole
    payload of an ``error`` event (``runtime.failures``)."""

    type: str
    message: str


class RequestPayload(TypedDict, total=False):
    """``request``: a provider call about to be made (``runtime.model_step.ask_model``). A
    missing ``system`` / ``tools`` means "as the previous request"."""

    iteration: int  # 0-based; the screens number rounds from 1 (``display.round_number``)
    final: bool  # no tools offered: the round cap was reached
    system: str | None
    message_count: int
    tools: list[str]


class LlmPayload(TypedDict, total=False):
    """``llm``: the model's answer (``runtime.model_step.ask_model``)."""

    iteration: int
    final: bool
    content: str | None
    tool_calls: list[ProposedCall]
    usage: dict[str, int]
    model: str
    normalised: list[str]  # what ``providers.replies`` normalised before storing it
    cost: str  # a decimal string, when the configuration is priced
    usage_unknown: bool  # the provider reported no usage (charged 0)
    framework: str  # the calls an external agent loop proposed (``agentruns.external``)


class ToolPayload(TypedDict, total=False):
    """``tool``: a call that ran or that its tool refused (``runtime.turn_step``; ``outcome``
    ``executed`` or ``refused``), did not run (``tool_step.unrun_event``: denied, expired,
    refused for its arguments; ``tool_step.answered_event``: a person answered it in place of
    running it) or was reconciled
    (``runtime.verdicts._reconciled``)."""

    call_id: str
    name: str
    arguments: Any  # only when not the proposed ones (the ``llm`` event stores those)
    effect: str | None
    outcome: str  # a key of ``display.TOOL_OUTCOMES``
    ok: bool
    result: Any
    error: str | None
    idempotency_key: str
    content: str  # a reconciled call: what the model reads
    normalised: list[str]  # what was mended for storage (text, number, depth, size)
    decided_by: str  # denied / answered by a person: their username
    reason: str  # denied: the reviewer's reason, verbatim
    edit: EditPayload  # ran with arguments a person edited (``arguments`` holds them)


class ApprovalPayload(TypedDict, total=False):
    """``approval``: a person's decision (``services.decisions.run_approve``) or the deadline's
    (``transitions.deadlines``, ``by: "deadline"`` with ``action`` and ``deadline``)."""

    approved: bool
    turn_digest: str | None
    mode: str  # a key of ``display.DECISION_MODES``
    decider: str | None
    calls: list[CallRef]
    authority: AuthorityPayload
    per_call: bool  # a verdict per call (each in ``calls``)
    reason: str  # a whole-turn denial's reason
    editor: str  # the decision edited a call: who
    by: str
    deadline: str | None
    action: str  # a key of ``display.DEADLINE_OUTCOMES``


class InputPayload(TypedDict, total=False):
    """``input``: a person's values for a call (``services.decisions``) or the deadline's
    expiry (``transitions.deadlines``: ``values`` ``None``, ``expired``, ``by``, ``action``)."""

    call_id: str
    name: str
    values: dict[str, Any] | None
    turn_digest: str | None
    mode: str
    decider: str | None
    expired: bool
    by: str
    deadline: str | None
    action: str


class ReconciliationPayload(TypedDict, total=False):
    """``reconciliation``: an in-doubt write resolved by a person (``services.decisions``,
    ``by: "person"``) or by its tool's automatic check (``services.reconciliation``, ``by: "check"``
    with ``evidence``, ``attempt`` and ``result``)."""

    verdict: str  # landed, not_landed, abandon
    turn_digest: str | None
    call: dict[str, Any] | None  # ``Call.to_json()``
    mode: str
    decider: str | None
    by: str
    authority: AuthorityPayload
    evidence: str
    attempt: int
    result: Any
    normalised: list[str]  # what of the check's evidence or result was mended for storage


class LeasePayload(TypedDict, total=False):
    """``lease``: a claim (``transitions.segment_writes``), a requeue after a provider failure
    (``runtime.model_step``), a hand-back by a stopping worker (``Boundaries.hand_back``) or an
    abandon (``transitions.endings.run_abandon``)."""

    action: str  # a key of ``display.LEASE_ACTIONS``
    framework: str  # the external agent loop's framework (``agentruns.external``)
    retry_in_seconds: float
    error: ErrorPayload
    note: str
    at: str  # handed_back: the step boundary it was handed back at


class ReaperPayload(TypedDict, total=False):
    """``reaper``: a stale run's verdict (``reaper.batches``), a redispatch or an unsent
    wake-up (``reaper.wakeups``)."""

    rule: str  # a key of ``display.REAPER_RULES``
    verdict: str  # a key of ``display.REAPER_VERDICTS``
    detail: str
    error: ErrorPayload
    abandoned_by: str
    lease_epoch: int
    lease_expired_at: str | None
    requeue_count: int
    pending_effect: str
    unclaimed_for_s: float


class CancelPayload(TypedDict, total=False):
    """``cancel``: a person's cancel (``transitions.endings``) or one noticed by the segment."""

    note: str


class VerificationPayload(TypedDict, total=False):
    """``verification``: a decision refused at run time, because the turn about to run is not
    the one decided (``runtime.verdicts._mismatch``) or a write's preview changed
    (``runtime.previewing.preview_changed_event``)."""

    decision: str
    verdict: str  # mismatch, preview_changed
    message: str
    decided_digest: str
    executing_digest: str
    call_id: str
    name: str
    approved_preview: Any
    fresh_preview: Any


class InDoubtPayload(TypedDict, total=False):
    """``in_doubt``: a non-idempotent write whose tool could not say whether it took effect
    (``runtime.turn_step``)."""

    call_id: str
    name: str
    arguments: Any
    error: str


class CheckPayload(TypedDict, total=False):
    """``check``: a tool's automatic check that answered unknown, failed or timed out
    (``services.reconciliation``)."""

    by: str
    attempt: int
    answer: str
    evidence: str
    call_id: str
    name: str
    next_at: str | None
    left_to_person: bool
    normalised: list[str]


class BudgetPayload(TypedDict, total=False):
    """``budget``: a provider call refused because a daily budget is spent
    (``budgets.Exhausted.payload``); amounts are decimal strings."""

    budget: str  # configuration, user
    key: str
    spend: str
    reserved: str  # held by calls in flight
    limit: str
    currency: str
    day: str | None


class EscalationPayload(TypedDict, total=False):
    """``escalation``: nobody decided before the deadline, so the wait was handed to the
    escalation group with a second deadline (``transitions.escalation``)."""

    turn_digest: str
    by: str  # "deadline"
    waited: str  # the status it waited in
    deadline: str | None  # the first deadline, which passed
    group: str
    group_id: int | None
    timeout_seconds: float  # the second deadline, from the hand-over
    then: str  # deny or fail, at the second deadline


class OutputErrorPayload(TypedDict, total=False):
    """One way a final answer failed its output schema (``SchemaError.as_dict``)."""

    path: list[str | int]
    message: str


class OutputCheckPayload(TypedDict, total=False):
    """``output_check``: a final answer that did not match the configuration's output schema,
    sent back (``structured_output.judge``); ``message`` is what the model reads."""

    ok: bool
    errors: list[OutputErrorPayload]
    message: str


#: The payload shape of each kind.
PAYLOADS: dict[str, type] = {
    EventKind.REQUEST: RequestPayload,
    EventKind.LLM: LlmPayload,
    EventKind.TOOL: ToolPayload,
    EventKind.APPROVAL: ApprovalPayload,
    EventKind.INPUT: InputPayload,
    EventKind.RECONCILIATION: ReconciliationPayload,
    EventKind.LEASE: LeasePayload,
    EventKind.REAPER: ReaperPayload,
    EventKind.CANCEL: CancelPayload,
    EventKind.VERIFICATION: VerificationPayload,
    EventKind.ERROR: ErrorPayload,
    EventKind.IN_DOUBT: InDoubtPayload,
    EventKind.CHECK: CheckPayload,
    EventKind.BUDGET: BudgetPayload,
    EventKind.ESCALATION: EscalationPayload,
    EventKind.OUTPUT_CHECK: OutputCheckPayload,
}
