"""Words for what runs store as slugs: the one place every screen (the inbox, the timeline, the
playground, the admin) turns a status, a termination reason, an event kind, a tool's effect, a
lease action or a reaper verdict into what people read. Plain text only; callers escape it.

A value these tables do not know is shown as it is (a newer or corrupt stored value must still
show), never as an error.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from agentruns.models import Effect, EventKind, Status, TerminationReason

# What each effect means to a reviewer: a word (read / write), an icon and a sentence. The icon
# is decoration (hidden from screen readers); the words carry the meaning, colour is a third
# signal (see the stylesheets).
EFFECTS: dict[str, tuple[str, str, str]] = {
    Effect.READ: ("Read", "○", "changes nothing"),
    Effect.IDEMPOTENT_WRITE: ("Write", "✎", "idempotent: safe to repeat"),
    Effect.NON_IDEMPOTENT_WRITE: ("Write", "⚠", "non-idempotent: not safe to repeat"),
}
UNKNOWN_EFFECT = ("Write", "⚠", "effect not recorded: treated as non-idempotent")

LEASE_ACTIONS = {
    "claimed_at_birth": "claimed when the run started",
    "claimed": "claimed by a worker",
    "requeued": "handed back to the queue for a retry",
    "handed_back": "handed back to the queue: its worker was stopping",
    "abandoned": "abandoned: the client went away mid-stream",
    "claimed_by_loop": "claimed by its agent loop",
    "released": "released by its agent loop",
}
REAPER_RULES = {
    "fence": "a write was in flight when its lease expired",
    "not_rehydratable": "its stored state could not be read",
    "budget": "its retry budget was used up",
    "reclaim": "its lease expired",
    "redispatch": "nobody claimed it from the queue",
    "deadline": "it waited past its approval deadline",
}
REAPER_VERDICTS = {
    "in_doubt": "parked for reconciliation",
    "dead_lettered": "ended as failed",
    "requeued": "requeued",
    "skipped": "left alone (it was alive)",
    "redispatched": "sent a fresh wake-up",
    "denied": "denied on behalf of the deadline, continued",
    "escalated": "escalated at the deadline",
}
TOOL_OUTCOMES = {
    "executed": "ran",
    "denied": "denied, did not run",
    "answered": "answered by a person, not run",
    "expired": "expired (nobody decided in time), did not run",
    "invalid_arguments": "refused: its arguments break the tool's schema",
    "refused": "refused — not sent",
    "reconciled_landed": "took effect (said in reconciliation)",
    "reconciled_not_landed": "did not take effect (said in reconciliation)",
}
# What happens at an approval deadline (``ApprovalTimeoutAction``): what the card says will
# happen, and what the timeline says did.
DEADLINE_ACTIONS = {
    "deny": "then it is denied and the run continues",
    "fail": "then the run fails",
    "escalate": "then it is escalated to another group",
}
DEADLINE_OUTCOMES = {
    "deny": "denied, the run continues",
    "fail": "the run failed",
}
DECISION_MODES = {
    "inline": "continued at once",
    "queued": "handed to a worker",
}
SEGMENT_OUTCOMES = {
    "completed": "finished",
    "awaiting_approval": "now waits for approval",
    "awaiting_input": "now waits for input",
    "awaiting_reconciliation": "now waits for reconciliation",
    "suspend_failed": "could not pause",
    "failed": "failed",
    "cancelled": "cancelled",
    "requeued": "handed back to the queue",
    "handed_back": "handed back to the queue: the worker was stopping",
    "lease_lost": "stopped: another segment holds the run",
    "queued": "handed to a worker",
}


def _label(choices: Any, value: Any) -> str:
    return str(choices(value).label) if value in choices.values else str(value or "")


def status_label(value: Any) -> str:
    """``waiting_for_approval`` → "waiting for approval"."""
    return _label(Status, value)


def reason_label(value: Any) -> str:
    """A termination reason's words; "" for none."""
    return _label(TerminationReason, value)


def event_kind_label(value: Any) -> str:
    return _label(EventKind, value)


def effect_parts(value: Any) -> tuple[str, str, str]:
    """``(word, icon, sentence)`` for an effect; an unknown or missing one reads as a write."""
    return EFFECTS.get(value, UNKNOWN_EFFECT) if isinstance(value, str) else UNKNOWN_EFFECT


def effect_text(value: Any) -> str:
    """ "Write (non-idempotent: not safe to repeat)": the effect in words."""
    word, _, sentence = effect_parts(value)
    return f"{word} ({sentence})"


def is_read(value: Any) -> bool:
    return value == Effect.READ


def lookup(table: dict[str, str], value: Any) -> str:
    """``table``'s words for ``value``, or the value as it is."""
    return table.get(value, str(value or "")) if isinstance(value, str) else str(value or "")


def round_number(payload: Any) -> int | None:
    """The 1-based round of a ``request`` event (its payload stores the 0-based ``iteration``):
    the timeline and the playground number rounds the same way."""
    iteration = payload.get("iteration") if isinstance(payload, dict) else None
    if isinstance(iteration, int) and not isinstance(iteration, bool):
        return iteration + 1
    return None


def money(value: Any) -> str:
    """A cost as stored (a decimal, or the decimal string of an ``llm`` event) with the
    currency: "0.022500 USD"; "" for none."""
    if value is None or value == "":
        return ""
    from agentruns.budgets import currency

    return f"{value} {currency()}"


def _positive(value: Any) -> bool:
    """A decimal string above 0 (anything else, e.g. an older event without it, is not)."""
    try:
        return isinstance(value, str) and Decimal(value) > 0
    except InvalidOperation:
        return False


def budget_text(payload: Any) -> str:
    """A ``budget`` event in words: "the configuration's daily budget is spent: 5.002500 of
    5.000000 USD (2026-12-01, UTC); the model was not called" (and what calls in flight hold
    of it, when they hold something)."""
    p = payload if isinstance(payload, dict) else {}
    whose = {"configuration": "the configuration's", "user": "the user's"}.get(
        str(p.get("budget")), "a"
    )
    day = f" ({p['day']}, UTC)" if p.get("day") else ""
    reserved = p.get("reserved")
    held = f", {reserved} more held by calls in flight" if _positive(reserved) else ""
    return (
        f"{whose} daily budget is spent: {p.get('spend', '?')} of {p.get('limit', '?')} "
        f"{p.get('currency', '')}{held}{day}; the model was not called"
    )


def writes_first(calls: Any) -> list[tuple[int, Any]]:
    """``(1-based position, call)`` pairs, writes before reads, each group in proposal order:
    the calls that change something are read first (their arguments open, reads folded)."""
    numbered = list(enumerate(calls, start=1))
    return [p for p in numbered if not _reads(p[1])] + [p for p in numbered if _reads(p[1])]


def _reads(call: Any) -> bool:
    effect = call.get("effect") if isinstance(call, dict) else getattr(call, "effect", None)
    return is_read(effect)


_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def duration_text(seconds: float) -> str:
    """``seconds`` in words, to its two largest units: ``4 hours``, ``1 day, 2 hours``."""
    left = max(0, round(seconds))
    parts = []
    for name, size in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
    return ", ".join(parts[:2]) or "0 seconds"
