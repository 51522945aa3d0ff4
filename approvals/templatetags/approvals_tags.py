"""Template filters of the inbox. Every one returns plain text (autoescaped by the template) or
markup built with ``format_html`` from our own constants — never model-chosen text marked safe."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

from agentruns import display
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


def _calls(calls: Any) -> str:
    if not isinstance(calls, list):
        return ""
    return ", ".join(str(c.get("name")) for c in calls if isinstance(c, dict))


@register.filter
def event_summary(event: Any) -> str:
    """One line saying what an event recorded, from its payload (plain text)."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    kind = event.kind
    if kind == "request":
        final = " (final, no tools offered)" if payload.get("final") else ""
        return f"Asked the model, round {display.round_number(payload) or '?'}{final}"
    if kind == "llm":
        calls = _calls(payload.get("tool_calls"))
        if calls:
            cost = f" (cost {display.money(payload['cost'])})" if payload.get("cost") else ""
            return f"The model proposed: {calls}{cost}"
        content = str(payload.get("content") or "")
        cost = f" (cost {display.money(payload['cost'])})" if payload.get("cost") else ""
        answered = f"The model answered: {content[:200]}" if content else "The model answered"
        return answered + cost
    if kind == "tool":
        outcome = display.lookup(display.TOOL_OUTCOMES, payload.get("outcome", ""))
        ok = (
            ""
            if payload.get("ok") in (None, True)
            or outcome.startswith(("denied", "refused", "expired"))
            else " — failed"
        )
        effect = display.effect_text(payload.get("effect"))
        return f"{payload.get('name', '?')} — {effect}: {outcome}{ok}"
    if kind == "approval":
        verdict = "approved" if payload.get("approved") else "denied"
        calls = _calls(payload.get("calls"))
        if payload.get("by") == "deadline":
            then = display.lookup(display.DEADLINE_OUTCOMES, payload.get("action"))
            shown = f": {calls}" if calls else ""
            return f"Expired: nobody decided before the deadline — {then}{shown}"
        return f"{verdict.capitalize()}{': ' + calls if calls else ''}"
    if kind == "input":
        if payload.get("by") == "deadline":
            then = display.lookup(display.DEADLINE_OUTCOMES, payload.get("action"))
            return (
                f"Expired: nobody answered {payload.get('name', '?')} before the deadline — {then}"
            )
        return f"Input supplied for {payload.get('name', '?')}"
    if kind == "reconciliation":
        verdicts: dict[Any, str] = {
            "landed": "the call took effect",
            "not_landed": "the call did not take effect",
            "abandon": "the run was abandoned",
        }
        said = verdicts.get(payload.get("verdict"), payload.get("verdict"))
        if payload.get("by") == "check":
            return (
                f"Reconciled by the automatic check: {said} ({str(payload.get('evidence'))[:200]})"
            )
        return f"Reconciled: {said}"
    if kind == "check":
        left = " — left to a person" if payload.get("left_to_person") else ""
        return (
            f"Automatic check {payload.get('attempt', '?')}: {payload.get('answer', '?')} "
            f"({str(payload.get('evidence'))[:200]}){left}"
        )
    if kind == "lease":
        return display.lookup(display.LEASE_ACTIONS, payload.get("action"))
    if kind == "reaper":
        rule = display.lookup(display.REAPER_RULES, payload.get("rule"))
        verdict = display.lookup(display.REAPER_VERDICTS, payload.get("verdict"))
        return f"Reaper: {rule} — {verdict}" if rule else f"Reaper: {verdict}"
    if kind == "cancel":
        return str(payload.get("note") or "cancelled")
    if kind == "budget":
        text = display.budget_text(payload)
        return text[:1].upper() + text[1:]
    return ""


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
