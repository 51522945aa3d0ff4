"""Template filters of the inbox. Every one returns plain text (autoescaped by the template) or
markup built with ``format_html`` from our own constants — never model-chosen text marked safe."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

from agentruns import display, event_summaries
from agentruns.attribution import Attribution
from agentruns.jsonview import pretty_arguments, pretty_json
from approvals.feedback import ATTRIBUTIONS, NO_APPROVALS

register = template.Library()

LONG_LINES = 12
LONG_CHARS = 600


register.filter("pretty_json", pretty_json)  # agentruns.jsonview: the one JSON printer
register.filter("pretty_arguments", pretty_arguments)  # a call's arguments, keys as sent


@register.filter
def is_long(text: str) -> bool:
    """Whether a block of text should fold into ``<details>``."""
    return len(text) > LONG_CHARS or text.count("\n") + 1 > LONG_LINES


@register.filter
def preview_text(value: Any) -> str:
    """A preview's before/after value as text: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else pretty_json(value)


@register.filter
def line_count(text: str) -> int:
    return text.count("\n") + 1


# The kind of a card, as its badge says it (the full card's heading says the same).
INBOX_KINDS = {
    "approval": "Awaiting approval",
    "input": "Waiting for input",
    "reconciliation": "Waiting for reconciliation",
    "unreadable": "Unreadable",
}
ROW_QUESTION_CHARS = 80


@register.filter
def inbox_kind(kind: Any) -> str:
    return INBOX_KINDS.get(kind, str(kind)) if isinstance(kind, str) else str(kind)


@register.filter
def card_calls(card: Any) -> str:
    """What a card waits on in a few words, for its one-line row (plain text): each call's tool
    and effect word for an approval, the question for input, the call in doubt."""
    pending = card.pending
    if pending.kind == "unreadable":
        return "what it waits for cannot be read"
    if pending.kind == "input" and pending.call is not None:
        question = pending.question
        if len(question) > ROW_QUESTION_CHARS:
            question = question[: ROW_QUESTION_CHARS - 1] + "…"
        return f"{pending.call.name} asks: {question}" if question else f"{pending.call.name} asks"
    if pending.kind == "reconciliation" and pending.call is not None:
        return f"{pending.call.name} in doubt"
    shown = [
        f"{call.name} ({display.effect_parts(call.effect)[0].lower()})" for call in pending.calls
    ]
    return ", ".join(shown) if len(shown) < 2 else f"{len(shown)} calls: " + ", ".join(shown)


# A call's verdict on an approval event, in words (the timeline lists them per call).
VERDICT_WORDS = {
    "approve": "approved",
    "deny": "denied",
    "answer": "answered by the reviewer, not run",
    "edit": "arguments edited (a new card followed, to approve)",
}


@register.filter
def verdict_words(verdict: Any) -> str:
    return VERDICT_WORDS.get(verdict, str(verdict)) if isinstance(verdict, str) else ""


@register.filter
def verdicts_worth_listing(verdicts: Any) -> bool:
    """Whether an approval's per-call verdicts say more than its summary: several calls, or one
    with a reason, an answer or an edit."""
    calls = list(verdicts or ())
    return len(calls) > 1 or any(v.reason or v.verdict in ("answer", "edit") for v in calls)


@register.filter
def short_uuid(value: Any) -> str:
    return str(value)[:8]


@register.simple_tag
def attribution(value: str | None) -> str:
    """The attribution of a run: a visible text badge for self-approval, a sentence otherwise."""
    if value is None:
        return format_html('<span class="approvals-attribution">{}</span>', NO_APPROVALS)
    sentence = ATTRIBUTIONS.get(value, str(value))
    if value == Attribution.SELF:
        return format_html(
            '<span class="approvals-attribution"><strong class="approvals-badge '
            'approvals-badge-self">Self-approved</strong> {}</span>',
            sentence,
        )
    return format_html('<span class="approvals-attribution">{}</span>', sentence)


@register.filter
def event_summary(event: Any) -> str:
    """One line saying what an event recorded, from its payload (plain text): the one table of
    summaries (``agentruns.event_summaries``)."""
    return event_summaries.summarise(event.kind, event.payload)


@register.filter
def decider(event: Any) -> str:
    """Who decided (decision events only): the account, or the name recorded if it is gone."""
    if event.actor_id is not None and event.actor is not None:
        return event.actor.get_username()
    payload = event.payload if isinstance(event.payload, dict) else {}
    if payload.get("by") == "check":
        return "the automatic check"
    if payload.get("by") == "deadline":
        return "the approval deadline"
    recorded = payload.get("decider")
    if recorded:
        return f"{recorded} (account no longer exists)"
    return ""
