"""Template tags every Leasehold screen uses to show a run the same way: words for slugs
(``agentruns.display``), one run id form, one effect badge, one way to show a time.

``{% load leasehold %}``. Filters return plain text (autoescaped by the template); tags build
markup with ``format_html`` from our own constants and escaped values — never model-chosen text
marked safe.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince, timeuntil

from agentruns import decided_calls, display
from agentruns.jsonview import pretty_json
from agentruns.permission_words import authority_permissions
from agentruns.run_counts import run_counts
from agentruns.versions import pinned_or_live, version_label

register = template.Library()
register.filter("pretty_json", pretty_json)  # the one JSON printer, for a value a person chose

register.filter("status_label", display.status_label)
# A run's configuration version (``v3``) and its configuration as the run sees it (pinned).
register.filter("run_version", version_label)
register.filter("pinned_configuration", pinned_or_live)
register.filter("reason_label", display.reason_label)
register.filter("event_kind_label", display.event_kind_label)
register.filter("effect_text", display.effect_text)
register.filter("is_read_effect", display.is_read)
register.filter("writes_first", display.writes_first)
register.filter("round_number", display.round_number)
register.filter("money", display.money)
register.filter("budget_text", display.budget_text)
# ``{% with counts=run|run_counts %}``: rounds and tokens so far, for every status.
register.filter("run_counts", run_counts)
register.filter("decided_call", decided_calls.decided_call)
register.filter("approval_verdicts", decided_calls.approval_verdicts)

_TABLES = {
    "lease_action": display.LEASE_ACTIONS,
    "reaper_rule": display.REAPER_RULES,
    "reaper_verdict": display.REAPER_VERDICTS,
    "tool_outcome": display.TOOL_OUTCOMES,
    "decision_mode": display.DECISION_MODES,
    "segment_outcome": display.SEGMENT_OUTCOMES,
    "deadline_action": display.DEADLINE_ACTIONS,
}


@register.filter
def words(value: Any, table: str) -> str:
    """``{{ p.action|words:"lease_action" }}``: the words for a stored slug."""
    return display.lookup(_TABLES.get(table, {}), value)


@register.simple_tag
def effect_badge(effect: Any) -> str:
    """The effect as an icon (decoration), a word (Read / Write) and a sentence; the class
    gives it a colour as a third signal."""
    word, icon, sentence = display.effect_parts(effect)
    css = effect if isinstance(effect, str) and effect in display.EFFECTS else "unknown"
    return format_html(
        '<span class="lh-effect lh-effect-{}"><span class="lh-effect-icon" aria-hidden="true">'
        "{}</span> <strong>{}</strong> <span>({})</span></span>",
        css,
        icon,
        word,
        sentence,
    )


@register.simple_tag
def run_id(uuid: Any) -> str:
    """A run's id as every screen shows it: the first 8 characters, the whole id on hover
    (and in ``data-run-id``, for copying); the run's own page shows it in full."""
    full = str(uuid)
    return format_html(
        '<code class="lh-run-id" title="{}" data-run-id="{}">{}</code>', full, full, full[:8]
    )


def _local(value: datetime) -> datetime:
    return timezone.localtime(value) if timezone.is_aware(value) else value


@register.simple_tag
def when(value: Any, precise: bool = True) -> str:
    """A time in the page's zone with the zone named ("2026-11-30 21:40:20 UTC"), to the second
    (``precise=False``: to the minute); the exact stored value on hover."""
    if not isinstance(value, datetime):
        return "—"
    local = _local(value)
    shown = date_format(local, "Y-m-d H:i:s T" if precise else "Y-m-d H:i T")
    exact = local.isoformat(timespec="microseconds")
    return format_html('<time datetime="{}" title="{}">{}</time>', exact, exact, shown)


@register.simple_tag
def age(value: Any) -> str:
    """ "3 minutes ago" (``ago``), the time in the page's zone on hover (``when``'s text)."""
    if not isinstance(value, datetime):
        return "—"
    local = _local(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        local.isoformat(timespec="microseconds"),
        date_format(local, "Y-m-d H:i:s T"),
        ago(value),
    )


@register.filter
def ago(value: Any) -> str:
    """ "3 minutes ago" (a time in the future, from a skewed clock, reads "just now")."""
    if not isinstance(value, datetime):
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"  # (a time in the future, from a skewed clock, too)
    return f"{timesince(value, depth=1)} ago"


@register.filter
def expires_in(value: Any) -> str:
    """ "expires in 12 minutes" for a deadline ahead, "expired 3 minutes ago" (or "expired just
    now") for one passed — by this server's clock, for reading only: the reaper decides by the
    database clock."""
    if not isinstance(value, datetime):
        return ""
    left = (value - timezone.now()).total_seconds()
    if left >= 60:
        return f"expires in {timeuntil(value, depth=2)}"
    if left > 0:
        return "expires in less than a minute"
    if left > -60:
        return "expired just now"
    return f"expired {timesince(value, depth=1)} ago"


@register.simple_tag
def time_zone_name() -> str:
    """The zone the page's times are shown in."""
    return str(timezone.get_current_timezone_name())


@register.simple_tag
def permissions_in_words(authority: Any) -> str:
    """Under a refusal: each permission the ``Authority`` lacks, by its name and the groups
    holding it (``agentruns.permission_words``); nothing when it lacks none."""
    sentences = [words.sentence() for words in authority_permissions(authority)]
    if not sentences:
        return ""
    return format_html(
        '<ul class="lh-permissions">{}</ul>',
        format_html_join("", "<li>{}</li>", ((sentence,) for sentence in sentences)),
    )
