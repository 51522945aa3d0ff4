"""One line saying what an event recorded, from its payload: the one table every screen that
summarises an event uses (the inbox's run timeline, the playground trace).

Plain text only: a summary holds what a model, a tool or a person chose (a tool's name, an
answer, evidence), so it is never marked safe; the template escapes it. Nothing stored can make
it raise: a kind this version does not know reads ``UNKNOWN_KIND``, a payload that is not an
object is read as an empty one (each summary says "?" for what is missing), and a payload a
summary cannot read reads ``UNREADABLE`` (logged) — never a 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentruns import display
from agentruns.decided_calls import approval_verdicts, decided_call
from agentruns.event_payloads import (
    ApprovalPayload,
    BudgetPayload,
    CancelPayload,
    CheckPayload,
    ErrorPayload,
    EscalationPayload,
    InDoubtPayload,
    InputPayload,
    LeasePayload,
    LlmPayload,
    OutputCheckPayload,
    ReaperPayload,
    ReconciliationPayload,
    RequestPayload,
    ToolPayload,
    VerificationPayload,
)
from agentruns.models import EventKind

logger = logging.getLogger(__name__)

UNKNOWN_KIND = "An event of a kind this version does not know"
UNREADABLE = "Unreadable: this event's payload could not be read"

# How far a summary quotes a long value (an answer, evidence, an error message).
QUOTED = 200

_RECONCILED = {
    "landed": "the call took effect",
    "not_landed": "the call did not take effect",
    "abandon": "the run was abandoned",
}


def _calls(calls: Any) -> str:
    """The names of a list of calls, comma-separated ("" for anything but a list)."""
    if not isinstance(calls, list):
        return ""
    return ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))


def _cost(p: LlmPayload) -> str:
    return f" (cost {display.money(p['cost'])})" if p.get("cost") else ""


def _deadline_outcome(p: ApprovalPayload | InputPayload) -> str:
    return display.lookup(display.DEADLINE_OUTCOMES, p.get("action"))


def request(p: RequestPayload) -> str:
    final = " (final, no tools offered)" if p.get("final") else ""
    return f"Asked the model, round {display.round_number(p) or '?'}{final}"


def llm(p: LlmPayload) -> str:
    calls = _calls(p.get("tool_calls"))
    framework = p.get("framework")
    # An external loop's model (docs/external.md): named, never priced by Leasehold.
    via = f", through {framework}" if isinstance(framework, str) and framework else ""
    if calls:
        return f"The model proposed{via}: {calls}{_cost(p)}"
    content = str(p.get("content") or "")
    answered = f"The model answered{via}: {content[:QUOTED]}" if content else "The model answered"
    return answered + _cost(p)


def _by_person(p: ToolPayload) -> str:
    """A person's verdict on the call, in words: "denied by alice, did not run (reason: …)",
    "answered by alice, not run", "ran (arguments edited by alice)"; "" for none."""
    decided = decided_call(p)
    if decided is None or decided.verdict == "expired":
        return ""
    if decided.verdict == "denied":
        if not decided.by:
            return ""
        said = f" (reason: {decided.reason[:QUOTED]})" if decided.reason else ""
        return f"denied by {decided.by}, did not run{said}"
    if decided.verdict == "answered":
        return f"answered by {decided.by or 'a person'}, not run"
    return f"ran (arguments edited by {decided.by or 'a person'})"


def tool(p: ToolPayload) -> str:
    outcome = _by_person(p) or display.lookup(display.TOOL_OUTCOMES, p.get("outcome", ""))
    not_run = outcome.startswith(("denied", "refused", "expired", "answered"))
    failed = "" if p.get("ok") in (None, True) or not_run else " — failed"
    effect = display.effect_text(p.get("effect"))
    mended = " (its result altered so that it could be stored)" if p.get("normalised") else ""
    return f"{p.get('name', '?')} — {effect}: {outcome}{failed}{mended}"


def approval(p: ApprovalPayload) -> str:
    calls = _calls(p.get("calls"))
    if p.get("by") == "deadline":
        shown = f": {calls}" if calls else ""
        return f"Expired: nobody decided before the deadline — {_deadline_outcome(p)}{shown}"
    if p.get("per_call"):
        each = ", ".join(
            f"{v.name or '?'} {_VERDICT_WORDS.get(v.verdict, v.verdict)}"
            for v in approval_verdicts(p)
        )
        return f"Decided per call: {each}"
    verdict = "Approved" if p.get("approved") else "Denied"
    reason = p.get("reason")
    said = f" (reason: {reason[:QUOTED]})" if isinstance(reason, str) and reason else ""
    return f"{verdict}{': ' + calls if calls else ''}{said}"


_VERDICT_WORDS = {
    "approve": "approved",
    "deny": "denied",
    "answer": "answered, not run",
    "edit": "edited (a new card follows)",
}


def input_(p: InputPayload) -> str:
    if p.get("by") == "deadline":
        then = _deadline_outcome(p)
        return f"Expired: nobody answered {p.get('name', '?')} before the deadline — {then}"
    return f"Input supplied for {p.get('name', '?')}"


def reconciliation(p: ReconciliationPayload) -> str:
    verdict = p.get("verdict")
    said = _RECONCILED.get(verdict, verdict) if isinstance(verdict, str) else verdict
    if p.get("by") == "check":
        evidence = str(p.get("evidence"))[:QUOTED]
        return f"Reconciled by the automatic check: {said} ({evidence})"
    return f"Reconciled: {said}"


def check(p: CheckPayload) -> str:
    left = " — left to a person" if p.get("left_to_person") else ""
    evidence = str(p.get("evidence"))[:QUOTED]
    return f"Automatic check {p.get('attempt', '?')}: {p.get('answer', '?')} ({evidence}){left}"


def lease(p: LeasePayload) -> str:
    action = display.lookup(display.LEASE_ACTIONS, p.get("action"))
    framework = p.get("framework")
    return f"{action} ({framework})" if isinstance(framework, str) and framework else action


def reaper(p: ReaperPayload) -> str:
    rule = display.lookup(display.REAPER_RULES, p.get("rule"))
    verdict = display.lookup(display.REAPER_VERDICTS, p.get("verdict"))
    return f"Reaper: {rule} — {verdict}" if rule else f"Reaper: {verdict}"


def cancel(p: CancelPayload) -> str:
    return str(p.get("note") or "cancelled")


def verification(p: VerificationPayload) -> str:
    name = f" {p['name']}" if p.get("name") else ""
    message = p.get("message") or "what would run is not what was decided"
    return f"Not run{name}: {message}"


def error(p: ErrorPayload) -> str:
    return f"Error: {p.get('type', '?')}: {str(p.get('message') or '')[:QUOTED]}"


def in_doubt(p: InDoubtPayload) -> str:
    said = str(p.get("error") or "")[:QUOTED]
    return f"{p.get('name', '?')} — outcome unknown, waits for reconciliation ({said})"


def budget(p: BudgetPayload) -> str:
    text = display.budget_text(p)
    return text[:1].upper() + text[1:]


def escalation(p: EscalationPayload) -> str:
    then = display.lookup(display.DEADLINE_OUTCOMES, p.get("then"))
    seconds = p.get("timeout_seconds")
    within = (
        f" for {display.duration_text(seconds)}"
        if isinstance(seconds, int | float) and not isinstance(seconds, bool)
        else ""
    )
    group = p.get("group") or "?"
    return f"Escalated: nobody decided in time — handed to {group}{within}, then {then}"


def output_check(p: OutputCheckPayload) -> str:
    errors: Any = p.get("errors")
    errors = errors if isinstance(errors, list) else []
    count = len(errors)
    first = errors[0] if count and isinstance(errors[0], dict) else {}
    said = str(first.get("message") or "")[:QUOTED]
    more = f" (and {count - 1} more)" if count > 1 else ""
    return f"Final answer sent back: it did not match the output schema: {said}{more}"


#: Each kind's summary, typed with its payload (``agentruns.event_payloads``).
SUMMARIES: dict[str, Callable[[Any], str]] = {
    EventKind.REQUEST: request,
    EventKind.LLM: llm,
    EventKind.TOOL: tool,
    EventKind.APPROVAL: approval,
    EventKind.INPUT: input_,
    EventKind.RECONCILIATION: reconciliation,
    EventKind.LEASE: lease,
    EventKind.REAPER: reaper,
    EventKind.CANCEL: cancel,
    EventKind.VERIFICATION: verification,
    EventKind.ERROR: error,
    EventKind.IN_DOUBT: in_doubt,
    EventKind.CHECK: check,
    EventKind.BUDGET: budget,
    EventKind.ESCALATION: escalation,
    EventKind.OUTPUT_CHECK: output_check,
}


def summarise(kind: Any, payload: Any) -> str:
    """One line of plain text for an event of ``kind`` holding ``payload`` (see the module
    docstring for what a kind or payload this cannot read gives)."""
    summary = SUMMARIES.get(kind) if isinstance(kind, str) else None
    if summary is None:
        return UNKNOWN_KIND
    readable = payload if isinstance(payload, dict) else {}
    try:
        return summary(readable)
    except Exception:  # a corrupt payload must still show: named, never a 500
        logger.warning("an event of kind %s has a payload its summary cannot read", kind)
        return UNREADABLE
