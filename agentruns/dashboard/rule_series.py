"""The dashboard's count of auto-approvals per standing approval (docs/standing_approvals.md):
one aggregate query over the window's ``used`` rule events (``approvalruleevent_kind`` index)."""

from __future__ import annotations

from django.db.models import Count, Sum

from agentruns.dashboard.series import ChartData, Series, Window
from agentruns.models import ApprovalRuleEvent, RuleEventKind

#: The rules shown, those that approved most.
RULES_SHOWN = 10


def auto_approvals_per_rule(window: Window) -> ChartData:
    """Per rule (the ``RULES_SHOWN`` that approved most in the last days of ``window``), the
    turns it approved and the calls they held."""
    rows = list(
        ApprovalRuleEvent.objects.filter(
            kind=RuleEventKind.USED, created_at__gte=window.first_day_start()
        )
        .values("rule__uuid", "rule__tool", "rule__configuration__slug")
        .annotate(turns=Count("id"), calls=Sum("calls"))
        .order_by("-turns", "rule__uuid")
    )
    shown, rest = rows[:RULES_SHOWN], rows[RULES_SHOWN:]
    labels = [
        f"{r['rule__tool']} on {r['rule__configuration__slug']} ({str(r['rule__uuid'])[:8]})"
        for r in shown
    ]
    notes = [f"{sum(r['turns'] for r in rows)} auto-approved turn(s) in {window.days} days"]
    if rest:
        notes.append(f"{len(rest)} more rule(s) not shown")
    return ChartData(
        x_labels=labels,
        series=[
            Series("turns approved", [float(r["turns"]) for r in shown]),
            Series("calls approved", [float(r["calls"] or 0) for r in shown]),
        ],
        unit="approvals",
        notes=notes,
    )
