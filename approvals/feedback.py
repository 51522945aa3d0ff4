"""What the inbox tells staff: every refusal, every outcome and every attribution, worded in one
place. Views pass the typed exception or the service's result here and show the sentence."""

from __future__ import annotations

from agentruns.attribution import Attribution
from agentruns.exceptions import (
    AlreadyDecided,
    ApprovalExpired,
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
)
from agentruns.models import Status
from agentruns.services.runtime.results import Outcome, SegmentResult

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
}


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
