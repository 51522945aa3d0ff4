"""Escalation (docs/design.md §5.11): a configuration whose ``on_approval_timeout`` is
``escalate`` hands a wait nobody decided by its deadline to its ``escalation_group`` — notified
at once, by email, with their signed review link — with a second deadline
(``escalation_timeout``) after which the final action (``on_escalation_timeout``: deny or fail)
applies. Both steps are the reaper's deadline pass, guarded like the deadline itself; the card
says who it was escalated to and when. Real runs through the services and the scripted
provider, on both databases (the threaded races: ``tests/agentruns/races/test_escalation.py``)."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import Group
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db.models import Value
from django.db.models.functions import Now
from django.test import override_settings
from django.urls import reverse
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from agentruns import event_summaries
from agentruns.exceptions import ApprovalExpired, NotPermitted
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    EventKind,
    NotificationState,
    Status,
    TerminationReason,
)
from agentruns.services import reaper, runs
from agentruns.services.deadline_sweep import NOTIFY_ESCALATED_TASK, expire_overdue
from agentruns.services.notifications import notifications_send
from agentruns.services.runtime.results import Outcome
from agentruns.tasks import notify_escalated
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import call, config, decider, snapshot, tool_turn

pytestmark = pytest.mark.django_db(transaction=True)

WRITE = call("probe_create", value="x")
LONG = timedelta(minutes=30)
SECOND = timedelta(hours=4)
DECIDE = "agentruns.decide_agentrun"
SITE = "http://testserver"


@pytest.fixture
def groups(db):
    return Group.objects.create(name="approvers"), Group.objects.create(name="on-call leads")


def member(group: Group, **fields):
    user = decider(**fields)
    user.groups.add(group)
    return user


def escalating(approvers: Group, leads: Group, *, then: str = "deny", script=None) -> AgentRun:
    configuration = config(
        script=script or [tool_turn(WRITE), {"content": "done"}],
        approver_group=approvers,
        approval_timeout=LONG,
        on_approval_timeout="escalate",
        escalation_group=leads,
        escalation_timeout=SECOND,
        on_escalation_timeout=then,
    )
    result = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return AgentRun.objects.get(pk=result.run.pk)


def pass_deadline(run: AgentRun) -> None:
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))


def reap() -> str:
    out = StringIO()
    call_command("reap_stale_runs", stdout=out)
    return out.getvalue()


def escalations(run: AgentRun) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run=run, kind=EventKind.ESCALATION))


def decide(run: AgentRun, actor, *, approved: bool = True):
    return runs.run_decide(
        run_uuid=run.uuid,
        actor=actor,
        approved=approved,
        turn_digest=card_digest(run),
        mode="queued",
    )


def verify(run: AgentRun) -> None:
    out = StringIO()
    call_command("verify_ledger", "--run", str(run.uuid), stdout=out)
    assert "intact" in out.getvalue()


# --- The configuration ----------------------------------------------------------------------------


def test_escalating_needs_a_deadline_a_group_and_a_second_deadline(groups):
    _, leads = groups
    bare = AgentConfigurationFactory.build(on_approval_timeout="escalate")
    with pytest.raises(ValidationError) as caught:
        bare.full_clean()
    assert {"approval_timeout", "escalation_group", "escalation_timeout"} <= set(
        caught.value.message_dict
    )
    for bad in (timedelta(0), timedelta(days=400)):
        wrong = AgentConfigurationFactory.build(escalation_timeout=bad)
        with pytest.raises(ValidationError) as caught:
            wrong.full_clean()
        assert "escalation_timeout" in caught.value.message_dict
    loop = AgentConfigurationFactory.build(on_escalation_timeout="escalate")
    with pytest.raises(ValidationError) as caught:
        loop.full_clean()
    assert "on_escalation_timeout" in caught.value.message_dict  # never escalates twice
    fine = AgentConfigurationFactory.build(
        approval_timeout=LONG,
        on_approval_timeout="escalate",
        escalation_group=leads,
        escalation_timeout=SECOND,
    )
    fine.full_clean()
    assert fine.on_escalation_timeout == "deny"  # the default


# --- The first deadline: escalated ----------------------------------------------------------------


def test_at_the_deadline_the_wait_goes_to_the_group_with_a_second_deadline(probes, groups):
    approvers, leads = groups
    run = escalating(approvers, leads, then="fail")
    digest = run.pending_turn["turn_digest"]
    pass_deadline(run)
    first = AgentRun.objects.get(pk=run.pk).approval_deadline
    queued = OrmQ.objects.count()

    output = reap()

    assert "verdict=escalated -> waiting_for_approval (escalated)" in output
    assert "past their approval deadline 1: denied 0, failed 0, escalated 1, skipped 0" in output
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL and run.pending_turn["turn_digest"] == digest
    assert run.escalated_to == leads and run.escalated_at is not None
    assert run.approval_timeout_action == "fail"  # the final action, at the second deadline
    assert run.approval_deadline - run.escalated_at == SECOND
    [event] = escalations(run)
    assert event.actor_id is None
    assert event.payload == {
        "turn_digest": digest,
        "by": "deadline",
        "waited": "waiting_for_approval",
        "deadline": first.isoformat(),
        "group": "on-call leads",
        "group_id": leads.pk,
        "timeout_seconds": SECOND.total_seconds(),
        "then": "fail",
    }
    summary = event_summaries.summarise(event.kind, event.payload)
    assert summary == (
        "Escalated: nobody decided in time — handed to on-call leads for 4 hours, then the run "
        "failed"
    )
    # The group is told at once: one task, carrying the run.
    [task] = OrmQ.objects.all()[queued:]
    package = SignedPackage.loads(task.payload)
    assert (package["func"], package["args"]) == (NOTIFY_ESCALATED_TASK, (str(run.uuid),))
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).exists()
    verify(run)


def test_the_group_is_told_at_once_by_email_with_their_own_review_link(probes, groups, client):
    approvers, leads = groups
    lead = member(leads, username="lead", email="lead@example.com")
    member(approvers, username="approver", email="approver@example.com")
    UserFactory(username="outsider", email="outsider@example.com", permissions=[DECIDE])
    run = escalating(approvers, leads)
    pass_deadline(run)
    reaper.reap_stale_runs()
    mail.outbox.clear()

    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE}):
        summary = notify_escalated(str(run.uuid))
        again = notify_escalated(str(run.uuid))  # a duplicate task: nobody is told twice

    assert summary == "escalation: told 1, failed 0, told before 0"
    assert again == "escalation: told 0, failed 0, told before 1"
    [message] = mail.outbox
    assert message.to == ["lead@example.com"]
    assert message.subject == "Leasehold: a run was escalated to you"
    assert "escalated to on-call leads, a group you are in" in message.body
    link = re.search(r"Review and decide: (\S+)", message.body).group(1).removeprefix(SITE)
    client.force_login(lead)
    page = client.get(link)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'value="approve"' in html  # the group may approve now
    assert "Escalated" in html and "on-call leads" in html


def test_the_next_digest_tells_everyone_else_it_was_escalated_and_not_the_group_again(
    probes, groups
):
    approvers, leads = groups
    member(leads, username="lead", email="lead@example.com")
    member(approvers, username="approver", email="approver@example.com")
    run = escalating(approvers, leads)
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": SITE}):
        notifications_send()
        assert {m.to[0] for m in mail.outbox} == {"approver@example.com"}  # before: approvers
        pass_deadline(run)
        reaper.reap_stale_runs()
        notify_escalated(str(run.uuid))
        NotificationState.objects.update(last_sent_at=Now() - Value(timedelta(hours=1)))
        mail.outbox.clear()
        notifications_send()
    [digest] = mail.outbox
    assert digest.to == ["approver@example.com"]
    assert "escalated to on-call leads at" in digest.body


def test_the_group_may_decide_once_escalated_and_not_before(probes, groups):
    approvers, leads = groups
    lead = member(leads)
    run = escalating(approvers, leads)
    with pytest.raises(NotPermitted, match="'approvers'"):
        decide(run, lead)
    pass_deadline(run)
    with pytest.raises(ApprovalExpired):  # past the deadline: the reaper's until it escalates
        decide(run, member(approvers))
    reaper.reap_stale_runs()
    outsider = decider()
    with pytest.raises(NotPermitted, match="'approvers' or of 'on-call leads' \\(escalated\\)"):
        decide(run, outsider)
    decide(run, lead)
    [event] = AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL)
    assert event.actor == lead and event.payload["authority"]["group"] == "on-call leads"
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.approval_deadline is None
    verify(run)


def test_the_inbox_card_says_to_whom_and_when(probes, groups, client):
    approvers, leads = groups
    reader = member(approvers)
    run = escalating(approvers, leads)
    client.force_login(reader)
    assert "approvals-escalated" not in client.get(reverse("approvals:inbox")).content.decode()
    api = client.get(reverse("api:run", args=[run.uuid])).json()["pending_turn"]
    assert (api["on_deadline"], api["escalated_to"], api["escalated_at"]) == (
        "escalate",
        None,
        None,
    )
    pass_deadline(run)
    reaper.reap_stale_runs()
    api = client.get(reverse("api:run", args=[run.uuid])).json()["pending_turn"]
    assert (api["on_deadline"], api["escalated_to"]) == ("deny", "on-call leads")
    assert api["escalated_at"] is not None
    html = client.get(reverse("approvals:inbox")).content.decode()
    assert re.search(r"<dt>Escalated</dt><dd>to <strong>on-call leads</strong> <time", html)
    assert "then the run fails" not in html and "then it is denied" in html
    assert (
        "Escalated: nobody decided in time"
        in client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    )


# --- The second deadline: the final action --------------------------------------------------------


@pytest.mark.parametrize("then", ["deny", "fail"])
def test_at_the_second_deadline_the_final_action_applies(probes, groups, then):
    approvers, leads = groups
    run = escalating(approvers, leads, then=then)
    pass_deadline(run)
    reaper.reap_stale_runs()
    pass_deadline(run)

    report = reaper.reap_stale_runs()

    assert [v.verdict for v in report.expired] == ["denied" if then == "deny" else "dead_lettered"]
    run.refresh_from_db()
    if then == "deny":
        assert run.status == Status.QUEUED
    else:
        assert (run.status, run.termination_reason) == (
            Status.FAILED,
            TerminationReason.APPROVAL_EXPIRED,
        )
    [event] = AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL)
    assert event.payload["by"] == "deadline" and event.payload["action"] == then
    assert len(escalations(run)) == 1
    verify(run)


def test_a_decision_before_the_deadline_leaves_nothing_to_escalate(probes, groups):
    approvers, leads = groups
    run = escalating(approvers, leads)
    decide(run, member(approvers))
    pass_deadline(run)  # its deadline column is cleared by the decision: nothing is overdue
    assert reaper.reap_stale_runs().expired == []
    assert escalations(run) == []


def test_a_configuration_that_cannot_escalate_any_more_ends_the_wait_at_once(probes, groups):
    # The group is live (people, not versions); the second deadline is the run's pinned
    # version's (tests/agentruns/services/test_versions_pinning.py).
    approvers, leads = groups
    timeout_removed = escalating(approvers, leads, then="deny")
    pass_deadline(timeout_removed)
    type(timeout_removed.configuration).objects.filter(pk=timeout_removed.configuration_id).update(
        escalation_group=None
    )
    deactivated = escalating(approvers, leads, then="deny")
    pass_deadline(deactivated)
    type(deactivated.configuration).objects.filter(pk=deactivated.configuration_id).update(
        is_active=False
    )

    planned = {o.run_uuid: o.action for o in expire_overdue(identity="reaper:t:1", dry_run=True)}
    assert planned == {timeout_removed.uuid: "deny", deactivated.uuid: "fail"}
    reaper.reap_stale_runs()

    assert AgentRun.objects.get(pk=timeout_removed.pk).status == Status.QUEUED
    assert AgentRun.objects.get(pk=deactivated.pk).status == Status.FAILED
    assert escalations(timeout_removed) == escalations(deactivated) == []


def test_a_dry_run_says_it_would_escalate_and_changes_nothing(probes, groups):
    approvers, leads = groups
    run = escalating(approvers, leads)
    pass_deadline(run)
    before = snapshot(run)
    [outcome] = expire_overdue(identity="reaper:t:1", dry_run=True)
    assert (outcome.action, outcome.result) == ("escalate", "waiting_for_approval (escalated)")
    assert snapshot(run) == before and escalations(run) == []


def test_the_next_wait_is_nobodys_escalation(probes, groups):
    approvers, leads = groups
    lead = member(leads)
    run = escalating(
        approvers,
        leads,
        script=[tool_turn(WRITE), tool_turn(call("probe_create", value="y")), {"content": "ok"}],
    )
    pass_deadline(run)
    reaper.reap_stale_runs()
    decide(run, lead)
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == Outcome.AWAITING_APPROVAL
    run.refresh_from_db()
    assert run.escalated_at is None and run.escalated_to is None
    assert run.approval_timeout_action == "escalate" and run.approval_deadline is not None
    with pytest.raises(NotPermitted):
        decide(run, lead)  # the group's authority was for the escalated wait only
