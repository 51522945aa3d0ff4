"""The dashboard's count of auto-approvals per standing approval (docs/standing_approvals.md)."""

from __future__ import annotations

import pytest

from agentruns.dashboard.rule_series import RULES_SHOWN, auto_approvals_per_rule
from agentruns.dashboard.series import Window
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.dashboard import auto_approvals

pytestmark = pytest.mark.django_db


def test_auto_approvals_are_counted_per_rule_most_first():
    configuration = AgentConfigurationFactory(slug="hooks")
    auto_approvals(configuration, 30)  # 12 rules: six approved three turns, six two

    data = auto_approvals_per_rule(Window.ending_now())

    assert len(data.x_labels) == RULES_SHOWN
    assert data.x_labels[0].startswith("tool_") and " on hooks (" in data.x_labels[0]
    turns, calls = data.series
    assert turns.values[:6] == [3.0] * 6 and turns.values[6:] == [2.0] * 4
    assert data.notes == ["30 auto-approved turn(s) in 14 days", "2 more rule(s) not shown"]
    assert all(c >= t for c, t in zip(calls.values, turns.values, strict=True))


def test_no_auto_approval_is_nothing_to_show():
    assert auto_approvals_per_rule(Window.ending_now()).empty
