"""Standing approvals at use (docs/standing_approvals.md; both databases): a turn every call of
which an active rule covers is approved at once by the rule's author, through the recorded
decision (digest-bound, in the ledger), and the card never appears; anything else waits on its
card. The race for the last use is ``tests/agentruns/races/test_standing_approvals.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db.models.functions import Now

from agentruns import transitions
from agentruns.event_summaries import summarise
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    ApprovalRule,
    Effect,
    EventKind,
    Status,
)
from agentruns.services import reaper, standing_approvals
from agentruns.services.approval_rules import approval_rule_revoke
from agentruns.services.reaper import Verdict
from agentruns.services.runs import run_process_queued
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, registry
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.rules import audit, author, make_rule, row, start, uses
from tests.agentruns.support.runtime import (
    call,
    config,
    decide_inline,
    decider,
    kinds,
    outcome_unknown_once,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("probes"),
]


def approval_events(run: AgentRun) -> list[dict[str, Any]]:
    return [
        e.payload
        for e in AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).order_by("sequence")
    ]


# --- Match and no match -----------------------------------------------------------------------


def test_a_matching_call_is_approved_by_the_rules_author_and_never_waits(probes):
    configuration = config()
    alice = author(username="alice")
    rule = make_rule(configuration, by=alice)

    result = start(configuration)

    assert result.outcome == Outcome.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    [approval] = approval_events(result.run)
    assert approval["approved"] is True and approval["by"] == "rule"
    assert approval["decider"] == "alice"
    assert approval["rules"] == [
        {"rule": str(rule.uuid), "author": "alice", "call_ids": ["call_0_0"]}
    ]
    assert approval["turn_digest"]
    event = AgentRunEvent.objects.get(run=result.run, kind=EventKind.APPROVAL)
    assert event.actor_id == alice.pk
    assert summarise(event.kind, event.payload) == (
        "Approved by standing approval of alice: probe_write"
    )
    # The answer proposing the turn, then at once the approval: no wait in between.
    assert kinds(result.run)[:4] == ["lease", "request", "llm", "approval"]
    assert uses(rule) == 1
    assert audit(rule) == ["created", "used"]
    assert row(result.run).pending_turn is None


def test_arguments_the_schema_refuses_wait_on_the_card(probes):
    configuration = config()
    rule = make_rule(configuration)

    result = start(configuration, call("probe_write", value="something else"))

    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert probes.seen == []
    assert uses(rule) == 0 and audit(rule) == ["created"]


def test_a_rule_for_another_tool_or_configuration_approves_nothing(probes):
    configuration = config()
    make_rule(configuration, tool="probe_create")
    make_rule(config())

    result = start(configuration)

    assert result.outcome == Outcome.AWAITING_APPROVAL


def test_every_call_needing_a_decision_must_be_covered(probes):
    configuration = config()
    rule = make_rule(configuration)

    covered = start(configuration, call("probe_read", value="x"), call("probe_write", value="ok"))
    uncovered = start(
        configuration, call("probe_write", value="ok"), call("probe_create", value="ok")
    )

    assert covered.outcome == Outcome.COMPLETED  # the read needs no decision
    assert uncovered.outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 1


# --- Expiry, revoke, uses -------------------------------------------------------------------


def test_an_expired_rule_approves_nothing(probes):
    configuration = config()
    rule = make_rule(configuration)
    ApprovalRule.objects.filter(pk=rule.pk).update(expires_at=Now() - timedelta(seconds=1))

    assert start(configuration).outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 0


def test_a_revoked_rule_approves_nothing(probes):
    configuration = config()
    alice = author()
    rule = make_rule(configuration, by=alice)
    approval_rule_revoke(actor=alice, rule_uuid=rule.uuid)

    assert start(configuration).outcome == Outcome.AWAITING_APPROVAL
    assert audit(rule) == ["created", "revoked"]


def test_a_rule_revoked_after_the_look_but_before_the_lock_approves_nothing(probes, monkeypatch):
    """The segment's look saw the rule active; the revoke commits before the rules are locked:
    the check under the lock wins."""
    configuration = config()
    alice = author()
    rule = make_rule(configuration, by=alice)
    real = standing_approvals.turn_is_covered

    def look_then_revoke(**kwargs: Any) -> bool:
        seen = real(**kwargs)
        approval_rule_revoke(actor=alice, rule_uuid=rule.uuid)
        return seen

    monkeypatch.setattr(standing_approvals, "turn_is_covered", look_then_revoke)

    result = start(configuration)

    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert row(result.run).status == Status.WAITING_FOR_APPROVAL
    assert uses(rule) == 0 and audit(rule) == ["created", "revoked"]


def test_an_exhausted_rule_stops_at_its_last_use(probes):
    configuration = config()
    rule = make_rule(configuration, max_uses=2)

    outcomes = [start(configuration).outcome for _ in range(3)]

    assert outcomes == [Outcome.COMPLETED, Outcome.COMPLETED, Outcome.AWAITING_APPROVAL]
    assert uses(rule) == 2


def test_two_calls_need_two_uses(probes):
    configuration = config()
    rule = make_rule(configuration, max_uses=1)

    two = start(configuration, call("probe_write", value="ok"), call("probe_write", value="ok"))

    assert two.outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 0


# --- Safety: four-eyes, failed preview, authority, in doubt ----------------------------------


def test_four_eyes_the_rules_author_never_approves_their_own_run(probes):
    configuration = config(require_second_approver=True)
    alice = author()
    rule = make_rule(configuration, by=alice)

    own = start(configuration, initiator=alice)
    someone_elses = start(configuration, initiator=decider())

    assert own.outcome == Outcome.AWAITING_APPROVAL
    assert someone_elses.outcome == Outcome.COMPLETED
    assert uses(rule) == 1


@pytest.fixture
def failing_preview():
    def raises(context: Any, arguments: Any) -> Any:
        raise RuntimeError("no preview today")

    tool = Tool(
        name="rule_preview_fails",
        description="A write whose preview fails.",
        parameters={"type": "object", "properties": {"value": {"type": "string"}}},
        effect=Effect.IDEMPOTENT_WRITE,
        func=lambda context, arguments: {"done": True},
        preview=raises,
    )
    registry.register(tool)
    yield tool
    registry.unregister(tool.name)


def test_a_call_whose_preview_failed_waits_for_a_person(probes, failing_preview):
    configuration = config(tools=["rule_preview_fails"])
    rule = make_rule(configuration, tool="rule_preview_fails")

    result = start(configuration, call("rule_preview_fails", value="ok"))

    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 0


def test_a_rule_whose_author_lost_authority_does_nothing(probes):
    configuration = config()
    alice = author()
    rule = make_rule(configuration, by=alice)
    alice.user_permissions.remove(Permission.objects.get(codename="decide_agentrun"))

    assert start(configuration).outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 0


def test_a_rule_never_gives_an_in_doubt_verdict(probes):
    configuration = config()
    rule = make_rule(configuration, tool="probe_create")
    probes.during = outcome_unknown_once()

    result = start(configuration, call("probe_create", value="ok"))

    assert result.outcome == Outcome.AWAITING_RECONCILIATION
    assert row(result.run).status == Status.WAITING_FOR_RECONCILIATION
    assert uses(rule) == 1  # the approval; the verdict is a person's
    assert [e["by"] for e in approval_events(result.run)] == ["rule"]


def test_a_person_still_decides_a_turn_no_rule_covers(probes):
    configuration = config()
    make_rule(configuration)
    waiting = start(configuration, call("probe_write", value="no")).run

    result = decide_inline(row(waiting))

    assert result.outcome == Outcome.COMPLETED


def test_a_configuration_without_an_unrevoked_rule_pays_no_statement_for_rules(probes):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    configuration = config()
    with CaptureQueriesContext(connection) as untouched:
        assert start(configuration).outcome == Outcome.AWAITING_APPROVAL
    approval_rule_revoke(actor=author(), rule_uuid=make_rule(configuration).uuid)
    with CaptureQueriesContext(connection) as revoked:
        assert start(configuration).outcome == Outcome.AWAITING_APPROVAL

    for queries in (untouched, revoked):
        assert not [q for q in queries.captured_queries if "approvalrule" in q["sql"]]


# --- A crash between counting the use and recording the approval ------------------------------


def test_dying_after_the_use_is_counted_undoes_the_count_and_the_suspend(probes, monkeypatch):
    """The worst gap: the use counted, the approval not yet recorded. The suspend, the count and
    the audit share one transaction: nothing of them stays; the run is still running under its
    dead lease, the reaper takes it back, and the next segment is approved once, counted once."""
    configuration = config()
    rule = make_rule(configuration)

    def dies(*args: Any, **kwargs: Any) -> Any:
        assert uses(rule) == 1  # counted in this transaction
        raise ProcessDied()

    with monkeypatch.context() as patch:
        patch.setattr(transitions, "record_decision", dies)
        with pytest.raises(ProcessDied):
            start(configuration)

    [run] = AgentRun.objects.all()
    assert (run.status, run.pending_turn) == (Status.RUNNING, None)
    assert uses(rule) == 0 and audit(rule) == ["created"]
    assert EventKind.APPROVAL not in kinds(run) and probes.seen == []

    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs().count(Verdict.REQUEUED) == 1
    result = run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.run.status == Status.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    assert uses(rule) == 1 and audit(rule) == ["created", "used"]
    assert len(approval_events(run)) == 1


def test_dying_after_the_commit_continues_from_the_recorded_approval(probes, monkeypatch):
    """Committed: the run is claimed for the continuing segment with the decision recorded and
    the use counted. Dying before that segment runs anything, the reaper hands it to a worker,
    which applies the same decision: the write runs once, the use is never counted again."""
    from agentruns.services.runtime import segment

    configuration = config()
    rule = make_rule(configuration)
    real, calls = segment._one_segment, []

    def dies_in_the_continuation(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ProcessDied()
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(segment, "_one_segment", dies_in_the_continuation)
        with pytest.raises(ProcessDied):
            start(configuration)

    [run] = AgentRun.objects.all()
    assert run.status == Status.RUNNING and run.claimed_by.startswith("resume:")
    assert uses(rule) == 1 and probes.seen == []
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
    assert reaper.reap_stale_runs().count(Verdict.REQUEUED) == 1

    result = run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.run.status == Status.COMPLETED
    assert [s["tool"] for s in probes.seen] == ["probe_write"]
    assert uses(rule) == 1 and len(approval_events(run)) == 1


def test_an_author_outside_the_approver_group_approves_nothing(probes):
    from django.contrib.auth.models import Group

    group = Group.objects.create(name="deployers")
    configuration = config(approver_group=group)
    alice = author()
    alice.groups.add(group)
    rule = make_rule(configuration, by=alice)
    assert start(configuration).outcome == Outcome.COMPLETED

    alice.groups.remove(group)

    assert start(configuration).outcome == Outcome.AWAITING_APPROVAL
    assert uses(rule) == 1
