"""What the inbox tells staff: every refusal, every outcome and every attribution, worded in one
place. Views pass the typed exception or the service's result here and show the sentence.

Every message after a decision names its run — a link to its timeline, the short id and the
configuration — before the sentence (``about_run``): after one of five identical cards, the
reviewer knows which one it was. Messages are built with ``format_html``: every model-, person-
or server-chosen part is escaped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from uuid import UUID

from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from agentruns.attribution import Attribution
from agentruns.exceptions import (
    AlreadyDecided,
    ApprovalExpired,
    CallsMismatch,
    InvalidArguments,
    InvalidInput,
    InvalidRequest,
    LeaseholdError,
    NotPermitted,
    NotWaiting,
    RunNotFound,
    SelfApprovalRefused,
    StaleTurn,
    StateWriteFailed,
    UnreadableState,
    ValueTooLong,
)
from agentruns.models import AgentRun, Status
from agentruns.services.batch_decisions import (
    ALREADY_DECIDED,
    APPROVED,
    DENIED,
    BatchOutcome,
)
from agentruns.services.runtime.results import Outcome, SegmentResult
from agentruns.turns import CallVerdict

# Refusals: nothing changed in any of these cases.
REFUSALS: dict[type[LeaseholdError], str] = {
    StaleTurn: "The pending action changed — review again.",
    AlreadyDecided: "Someone already decided this — nothing was changed.",
    ApprovalExpired: "Its approval deadline has passed — nothing was changed. The reaper settles "
    "it at its next pass, as its configuration says (deny, fail or escalate).",
    SelfApprovalRefused: "A colleague must approve; you may deny.",
    NotWaiting: "This run is not waiting for that decision anymore{status} — nothing was changed.",
    RunNotFound: "That run does not exist.",
    NotPermitted: "Not permitted — nothing was changed: {message}.",
    InvalidRequest: "The form was incomplete — nothing was changed. Review the run and try again.",
    InvalidInput: "The values do not match what the tool asked for — nothing was changed.",
    UnreadableState: "This run's stored state cannot be read — nothing was changed.",
    StateWriteFailed: "The database refused the change — nothing was changed. Try again.",
    CallsMismatch: "The verdicts did not name each call of the turn once — nothing was changed. "
    "Review the run and try again.",
    ValueTooLong: "A reason or an answer was too long — nothing was changed.",
    InvalidArguments: "The edited arguments do not match what the tool accepts — nothing was "
    "changed.",
}


def about_run(run: AgentRun | UUID | str, sentence: str) -> SafeString:
    """``sentence`` about a run, led by the run: *Run 7b7e07e3 (Notes assistant): …*, the run
    linked to its timeline. A run that could not be read (only its uuid is known) is named by its
    short id alone, unlinked: it may not exist."""
    if not isinstance(run, AgentRun):
        return format_html("Run {}: {}", str(run)[:8], sentence)
    return format_html(
        '<a href="{}">Run {}</a> ({}): {}',
        reverse("approvals:run", args=[run.uuid]),
        str(run.uuid)[:8],
        run.configuration.name,
        sentence,
    )


def refusal_message(exc: LeaseholdError) -> str:
    """The sentence shown for a refused decision."""
    for kind in type(exc).__mro__:
        template = REFUSALS.get(kind)
        if template is not None:
            break
    else:
        return f"Refused: {exc.message}"
    status = exc.detail.get("status") if isinstance(exc, NotWaiting) else None
    shown = f" (it is now {Status(status).label})" if status in Status.values else ""
    return template.format(status=shown, message=exc.message.rstrip("."))


def _continues(result: SegmentResult) -> str:
    if result.outcome == Outcome.QUEUED:
        return "A worker continues the run; its timeline shows what happens next."
    return f"The run is now {Status(result.run.status).label}."


def approval_message(result: SegmentResult, *, approved: bool) -> str:
    if approved:
        return f"Approved. {_continues(result)}"
    return (
        "Denied: none of the turn's calls runs, and the model is told an operator denied "
        f"them. {_continues(result)}"
    )


# The first line after deciding a selection; one message per run follows.
BATCH_SUMMARY = "{decided} of {selected} selected run{s} {verb}{rest}."


def batch_summary(outcomes: Sequence[BatchOutcome], *, approved: bool) -> str:
    """The first line after deciding a selection: how many were decided, how many were not."""
    decided = sum(1 for o in outcomes if o.decided)
    left = len(outcomes) - decided
    return BATCH_SUMMARY.format(
        decided=decided,
        selected=len(outcomes),
        s="" if len(outcomes) == 1 else "s",
        verb="approved" if approved else "denied",
        rest=f"; {left} not (each says why below)" if left else "",
    )


def batch_outcome_message(
    outcome: BatchOutcome, run: AgentRun | None, *, approved: bool
) -> SafeString:
    """What happened to one run of a selection, naming the run."""
    named: AgentRun | UUID = run if run is not None else outcome.run_uuid
    if outcome.outcome in (APPROVED, DENIED) and outcome.result is not None:
        return about_run(
            named, approval_message(outcome.result, approved=outcome.outcome == APPROVED)
        )
    assert outcome.refusal is not None
    if outcome.outcome == ALREADY_DECIDED:
        return about_run(named, refusal_message(outcome.refusal))
    verb = "approved" if approved else "denied"
    return about_run(named, f"Not {verb}: {refusal_message(outcome.refusal)}")


# A per-call decision's verdicts, as the message after it counts them.
VERDICT_WORDS = {"approve": "approved", "deny": "denied", "answer": "answered", "edit": "edited"}


def decision_message(
    result: SegmentResult,
    *,
    approved: bool | None = None,
    verdicts: Sequence[CallVerdict] | None = None,
) -> str:
    """After a decision: *Approve all* / *Deny all* as ``approval_message`` says them; per-call
    verdicts counted ("1 approved, 1 denied with your reason"), and what an edit means."""
    if verdicts is None:
        return approval_message(result, approved=bool(approved))
    counts: Counter[str] = Counter(v.verdict for v in verdicts)
    said = ", ".join(
        f"{counts[verdict]} {VERDICT_WORDS[verdict]}"
        for verdict in VERDICT_WORDS
        if counts[verdict]
    )
    reasons = (
        " The model reads your reasons, marked as your words."
        if any(v.reason for v in verdicts)
        else ""
    )
    if counts["edit"]:
        return (
            f"Decided per call: {said}.{reasons} Nothing runs yet: the edited turn comes back as a "
            "new card, with a fresh preview, for someone to approve."
        )
    return f"Decided per call: {said}.{reasons} {_continues(result)}"


def cancel_message(*, cancelled: bool, status: str) -> str:
    """After *Cancel run*: cancelled, or it had already ended (named by its status label)."""
    if cancelled:
        return (
            "Run cancelled. A segment still running it stops at its next step; a write already "
            "in flight finishes and is recorded."
        )
    shown = Status(status).label if status in Status.values else status
    return f"Nothing was cancelled: the run had already ended ({shown})."


def input_message(result: SegmentResult) -> str:
    return f"Input sent. {_continues(result)}"


def reconciliation_message(result: SegmentResult, *, verdict: str) -> str:
    if verdict == "landed":
        return f"Recorded: the call took effect. {_continues(result)}"
    if verdict == "not_landed":
        return (
            "Recorded: the call did not take effect; the model may propose it again, which "
            f"needs approval again. {_continues(result)}"
        )
    return "Run abandoned: it ended as failed (abandoned during reconciliation)."


# Shown beside every run that has approvals. Self-approval also gets a visible badge.
ATTRIBUTIONS: dict[str, str] = {
    Attribution.SELF: "The person who started this run approved its writes themselves.",
    Attribution.UNRESOLVED: (
        "Its writes were approved by someone who can no longer be identified, so a "
        "self-approval cannot be ruled out."
    ),
    Attribution.INITIATOR_UNKNOWN: (
        "Its writes were approved, but nobody is recorded as having started the run, so it "
        "cannot be told whether a second person approved."
    ),
    Attribution.SECOND_PERSON: "Its writes were approved by someone other than who started it.",
}
NO_APPROVALS = "No writes were approved in this run."
