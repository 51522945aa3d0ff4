"""Standing approvals under concurrency (docs/standing_approvals.md), real threads on PostgreSQL:
runs racing for a rule's last use approve at most one (the use is a guarded ``UPDATE`` under the
rule's row lock, in the transaction of the approval), and a revoke racing uses stops them at once
(every use the rule gave is ordered before its revoke on the row lock)."""

from __future__ import annotations

import pytest

from agentruns.models import ApprovalRuleEvent, RuleEventKind, Status
from agentruns.services.approval_rules import approval_rule_revoke
from agentruns.services.runtime.results import Outcome
from tests.agentruns.support.races import race
from tests.agentruns.support.rules import author, make_rule, row, start, uses
from tests.agentruns.support.runtime import config

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("probes"),
]

RACERS = 6
ROUNDS = 3


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_six_runs_racing_for_the_last_use_approve_exactly_one(probes, round_):
    configuration = config()
    rule = make_rule(configuration, max_uses=1)

    outcomes = race([lambda: start(configuration) for _ in range(RACERS)])

    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    results = [o.value for o in outcomes]
    assert sorted(r.outcome for r in results) == sorted(
        [Outcome.COMPLETED] + [Outcome.AWAITING_APPROVAL] * (RACERS - 1)
    )
    waiting = [r.run for r in results if r.outcome == Outcome.AWAITING_APPROVAL]
    assert all(row(run).status == Status.WAITING_FOR_APPROVAL for run in waiting)
    assert uses(rule) == 1
    assert ApprovalRuleEvent.objects.filter(rule=rule, kind=RuleEventKind.USED).count() == 1
    assert [s["tool"] for s in probes.seen] == ["probe_write"]


def test_a_revoke_racing_uses_stops_them_at_once(probes):
    configuration = config()
    alice = author()
    rule = make_rule(configuration, by=alice)

    calls = [lambda: start(configuration) for _ in range(RACERS - 1)]
    outcomes = race([*calls, lambda: approval_rule_revoke(actor=alice, rule_uuid=rule.uuid)])

    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    approved = [o.value for o in outcomes[:-1] if o.value.outcome == Outcome.COMPLETED]
    revoked = ApprovalRuleEvent.objects.get(rule=rule, kind=RuleEventKind.REVOKED)
    used = ApprovalRuleEvent.objects.filter(rule=rule, kind=RuleEventKind.USED)
    assert used.count() == len(approved) == uses(rule)
    assert all(event.pk < revoked.pk for event in used)  # no use after the revoke
