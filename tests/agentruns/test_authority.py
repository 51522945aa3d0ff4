"""Approver authority (docs/design.md §5.6): who may approve, deny and reconcile which turn.

Approving a turn, and a landed / not landed verdict, need ``decide_agentrun``, every call's
``approve_permission`` and membership of the configuration's approver group; denying and
abandoning need ``decide_agentrun`` only. The decision services check it under the row lock and
record what they checked in the decision's event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns.authority import (
    DECIDE_PERMISSION,
    Decider,
    approval_authority,
    deciding_authority,
)
from agentruns.exceptions import NotPermitted, SelfApprovalRefused, UnreadableState
from agentruns.models import AgentRun, Effect, EventKind, Status
from agentruns.services import runs
from agentruns.tools import Tool, registry
from agentruns.transitions import deciding as decision_transitions
from agentruns.turns import Call, PendingTurn, read_pending_turn
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import (
    WEBHOOK_CALL,
    WEBHOOK_SCRIPT,
    digest,
    in_doubt,
    waiting_for_approval,
    waiting_for_input,
)

pytestmark = pytest.mark.django_db

WEBHOOKS = "playground.approve_webhooks"
WEBHOOK_REFUSAL = "approving call_webhook needs playground.approve_webhooks"


def approve(run: AgentRun, actor, *, approved: bool = True):
    return runs.run_decide(
        run_uuid=run.uuid, actor=actor, approved=approved, turn_digest=digest(run), mode="queued"
    )


def reconcile(run: AgentRun, actor, verdict: str):
    return runs.run_reconcile(
        run_uuid=run.uuid, actor=actor, verdict=verdict, turn_digest=digest(run), mode="queued"
    )


def decision_events(run: AgentRun, kind: str) -> list:
    return list(run.events.filter(kind=kind))


def assert_unchanged(run: AgentRun, status: str) -> None:
    row = AgentRun.objects.get(pk=run.pk)
    assert row.status == status
    assert row.pending_turn is not None
    assert not row.events.filter(kind__in=[EventKind.APPROVAL, EventKind.RECONCILIATION]).exists()


# --- Approving -----------------------------------------------------------------------------------


def test_approving_a_webhook_needs_its_approve_permission_and_the_refusal_names_it():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted) as refused:
        approve(run, colleague)

    assert refused.value.message == WEBHOOK_REFUSAL
    assert refused.value.status == 403 and refused.value.code == "not_permitted"
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)


def test_with_the_permission_the_approval_records_the_authority_checked():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    approver = UserFactory(username="approver", permissions=[DECIDE_PERMISSION, WEBHOOKS])

    assert approve(run, approver).outcome == "queued"

    [event] = decision_events(run, EventKind.APPROVAL)
    assert event.payload["approved"] is True
    assert event.payload["authority"] == {
        "permissions": [DECIDE_PERMISSION, WEBHOOKS],
        "group": None,
    }


def test_a_superuser_holds_every_permission():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    root = UserFactory(username="root", is_superuser=True)

    assert approve(run, root).outcome == "queued"


def test_denying_needs_only_the_decide_permission():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    assert approve(run, colleague, approved=False).outcome == "queued"

    [event] = decision_events(run, EventKind.APPROVAL)
    assert event.payload["approved"] is False
    assert event.payload["authority"] == {"permissions": [DECIDE_PERMISSION], "group": None}


def test_a_tool_without_approve_permission_needs_only_the_decide_permission():
    run = waiting_for_approval()  # create_note
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    approve(run, colleague)

    [event] = decision_events(run, EventKind.APPROVAL)
    assert event.payload["authority"] == {"permissions": [DECIDE_PERMISSION], "group": None}


def test_without_the_decide_permission_nothing_else_is_looked_at():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    outsider = UserFactory(username="outsider", permissions=[WEBHOOKS])

    for approved in (True, False):
        with pytest.raises(NotPermitted, match="decide_agentrun"):
            approve(run, outsider, approved=approved)
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)


def test_every_call_of_the_turn_needs_its_authority():
    """A turn of a note and a webhook: the webhook's permission is needed for the whole turn."""
    script = [
        {"tool_calls": [{"name": "create_note", "arguments": {"title": "t"}}, WEBHOOK_CALL]},
        {"content": "done"},
    ]
    run = waiting_for_approval(script=script)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted, match=WEBHOOK_REFUSAL):
        approve(run, colleague)
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)


# --- The configuration's approver group ----------------------------------------------------------


def test_a_configuration_s_group_is_needed_to_approve_and_not_to_deny():
    group = Group.objects.create(name="note approvers")
    run = waiting_for_approval(slug="grouped", approver_group=group)
    outsider = UserFactory(username="outsider", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted) as refused:
        approve(run, outsider)
    assert refused.value.message == (
        "approving runs of grouped needs membership of the group 'note approvers'"
    )
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)

    member = UserFactory(username="member", permissions=[DECIDE_PERMISSION])
    member.groups.add(group)
    approve(run, member)
    [event] = decision_events(run, EventKind.APPROVAL)
    assert event.payload["authority"] == {
        "permissions": [DECIDE_PERMISSION],
        "group": "note approvers",
    }


def test_a_non_member_may_deny_a_grouped_run():
    group = Group.objects.create(name="note approvers")
    run = waiting_for_approval(slug="grouped", approver_group=group)
    outsider = UserFactory(username="outsider", permissions=[DECIDE_PERMISSION])

    assert approve(run, outsider, approved=False).outcome == "queued"


def test_group_membership_is_membership_even_for_a_superuser():
    group = Group.objects.create(name="note approvers")
    run = waiting_for_approval(slug="grouped", approver_group=group)
    root = UserFactory(username="root", is_superuser=True)

    with pytest.raises(NotPermitted, match="membership of the group 'note approvers'"):
        approve(run, root)
    root.groups.add(group)
    assert approve(run, root).outcome == "queued"


def test_the_group_is_read_when_deciding_not_when_the_turn_was_shown():
    run = waiting_for_approval(slug="later-grouped")
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])
    group = Group.objects.create(name="late approvers")
    type(run.configuration).objects.filter(pk=run.configuration_id).update(approver_group=group)

    with pytest.raises(NotPermitted, match="late approvers"):
        approve(run, colleague)


def test_missing_permission_and_group_are_both_named():
    group = Group.objects.create(name="webhook approvers")
    run = waiting_for_approval(script=WEBHOOK_SCRIPT, slug="hooks", approver_group=group)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted) as refused:
        approve(run, colleague)

    assert refused.value.message == (
        f"{WEBHOOK_REFUSAL}; approving runs of hooks needs membership of the group "
        "'webhook approvers'"
    )


# --- Tools that are not registered ---------------------------------------------------------------


def test_a_turn_calling_a_tool_nobody_registered_may_be_denied_but_never_approved():
    script = [{"tool_calls": [{"name": "no_such_tool", "arguments": {}}]}, {"content": "ok"}]
    run = waiting_for_approval(script=script)
    root = UserFactory(username="root", is_superuser=True)

    with pytest.raises(NotPermitted) as refused:
        approve(run, root)
    assert refused.value.message == (
        "approving no_such_tool needs a registered tool: no_such_tool is not one"
    )
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)
    assert approve(run, root, approved=False).outcome == "queued"


def _temporary_write(context, arguments):
    return {"ok": True}


def test_a_tool_unregistered_while_its_turn_waits_fails_closed():
    temporary = Tool(
        name="temporary_write",
        description="A write that will be gone.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.NON_IDEMPOTENT_WRITE,
        func=_temporary_write,
    )
    registry.register(temporary)
    try:
        script = [{"tool_calls": [{"name": "temporary_write", "arguments": {}}]}, {"content": "x"}]
        run = waiting_for_approval(script=script)
        assert read_pending_turn(run).calls[0].known
    finally:
        registry.unregister("temporary_write")
    root = UserFactory(username="root", is_superuser=True)

    # Issue 11 §6: a tool gone while its turn waited makes the turn unreadable, for everyone.
    with pytest.raises(UnreadableState, match="'temporary_write' is no longer registered"):
        approve(run, root)
    assert_unchanged(run, Status.WAITING_FOR_APPROVAL)


# --- Four-eyes is unchanged -----------------------------------------------------------------------


def test_four_eyes_still_refuses_an_initiator_who_has_every_other_authority():
    initiator = UserFactory(username="initiator", permissions=[DECIDE_PERMISSION, WEBHOOKS])
    run = waiting_for_approval(
        initiator, script=WEBHOOK_SCRIPT, slug="four-eyes", require_second_approver=True
    )

    with pytest.raises(SelfApprovalRefused):
        approve(run, initiator)
    assert approve(run, initiator, approved=False).outcome == "queued"


# --- Reconciliation -------------------------------------------------------------------------------


@pytest.mark.parametrize("verdict", ["landed", "not_landed"])
def test_a_verdict_on_an_in_doubt_webhook_needs_its_approve_permission(verdict):
    run = in_doubt(call=WEBHOOK_CALL)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted) as refused:
        reconcile(run, colleague, verdict)
    assert refused.value.message == "reconciling call_webhook needs playground.approve_webhooks"
    assert_unchanged(run, Status.WAITING_FOR_RECONCILIATION)

    approver = UserFactory(username="approver", permissions=[DECIDE_PERMISSION, WEBHOOKS])
    assert reconcile(run, approver, verdict).outcome == "queued"
    [event] = decision_events(run, EventKind.RECONCILIATION)
    assert event.payload["verdict"] == verdict
    assert event.payload["authority"] == {
        "permissions": [DECIDE_PERMISSION, WEBHOOKS],
        "group": None,
    }


def test_abandoning_an_in_doubt_webhook_needs_only_the_decide_permission():
    group = Group.objects.create(name="webhook approvers")
    run = in_doubt(call=WEBHOOK_CALL, slug="grouped-doubt", approver_group=group)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    result = reconcile(run, colleague, "abandon")

    assert result.run.status == Status.FAILED
    [event] = decision_events(run, EventKind.RECONCILIATION)
    assert event.payload["authority"] == {"permissions": [DECIDE_PERMISSION], "group": None}


def test_a_verdict_needs_the_group_of_the_configuration():
    group = Group.objects.create(name="note approvers")
    run = in_doubt(slug="grouped-doubt", approver_group=group)
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    with pytest.raises(NotPermitted, match="reconciling runs of grouped-doubt needs membership"):
        reconcile(run, colleague, "landed")
    colleague.groups.add(group)
    assert reconcile(run, colleague, "landed").outcome == "queued"


def test_a_verdict_on_a_tool_nobody_registered_is_refused_but_abandon_works():
    run = in_doubt(call={"name": "gone_tool", "arguments": {}})
    root = UserFactory(username="root", is_superuser=True)

    with pytest.raises(NotPermitted, match="reconciling gone_tool needs a registered tool"):
        reconcile(run, root, "not_landed")
    assert reconcile(run, root, "abandon").run.status == Status.FAILED


# --- The function every interface asks ------------------------------------------------------------


def webhook_turn() -> PendingTurn:
    return PendingTurn.for_approval(
        [Call(id="c1", name="call_webhook", arguments={}, effect=Effect.NON_IDEMPOTENT_WRITE)]
    )


def test_approval_authority_answers_what_may_be_done_and_what_is_missing():
    configuration = AgentConfigurationFactory()
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])
    nobody = UserFactory(username="nobody")

    seen = approval_authority(user=colleague, configuration=configuration, pending=webhook_turn())
    assert (seen.allowed, seen.may_decide) == (False, True)
    assert seen.missing == (WEBHOOK_REFUSAL,)
    assert seen.refusal == WEBHOOK_REFUSAL

    seen = approval_authority(user=nobody, configuration=configuration, pending=webhook_turn())
    assert (seen.allowed, seen.may_decide) == (False, False)
    assert seen.missing == (f"approving needs {DECIDE_PERMISSION}", WEBHOOK_REFUSAL)

    assert deciding_authority(colleague).allowed
    assert not deciding_authority(None).allowed


def test_an_input_turn_needs_what_deciding_needs():
    run = waiting_for_input()
    colleague = UserFactory(username="colleague", permissions=[DECIDE_PERMISSION])

    seen = approval_authority(
        user=colleague, configuration=run.configuration, pending=read_pending_turn(run)
    )

    assert seen.allowed and seen.permissions == (DECIDE_PERMISSION,)


def test_a_decider_reads_its_groups_once_for_a_page_of_cards():
    groups = [Group.objects.create(name=f"g{i}") for i in range(3)]
    configurations = [AgentConfigurationFactory(approver_group=g) for g in groups]
    member = UserFactory(username="member", permissions=[DECIDE_PERMISSION])
    member.groups.add(groups[1])
    member.has_perm(DECIDE_PERMISSION)  # warms Django's permission cache
    decider = Decider(member)
    for configuration in configurations:
        configuration.approver_group  # noqa: B018  (joined in the inbox's query)

    with CaptureQueriesContext(connection) as captured:
        allowed = [
            approval_authority(user=decider, configuration=c, pending=webhook_turn()).missing
            for c in configurations
        ]

    assert len(captured.captured_queries) == 1
    assert [any("membership" in m for m in missing) for missing in allowed] == [True, False, True]


# --- Authority changed while a decision waits for the row lock (real threads, PostgreSQL) --------


def _revoke_webhooks(run: AgentRun, approver) -> None:
    approver.user_permissions.remove(
        Permission.objects.get(content_type__app_label="playground", codename="approve_webhooks")
    )


def _group_the_configuration(run: AgentRun, approver) -> None:
    group = Group.objects.create(name="late approvers")
    type(run.configuration).objects.filter(pk=run.configuration_id).update(approver_group=group)


def _leave_the_group(run: AgentRun, approver) -> None:
    approver.groups.clear()


def _join_the_group(run: AgentRun, approver) -> None:
    approver.groups.add(run.configuration.approver_group)


#: What another thread changes between a decision's start and its row lock, and whether the
#: approver may still approve after it.
AUTHORITY_CHANGES: dict[str, tuple[Callable[[AgentRun, object], None], bool]] = {
    "approve permission revoked": (_revoke_webhooks, False),
    "configuration given an approver group": (_group_the_configuration, False),
    "approver left the group": (_leave_the_group, False),
    "approver joined the group": (_join_the_group, True),
}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", AUTHORITY_CHANGES)
def test_an_approval_is_judged_on_the_authority_as_it_stands_under_the_row_lock(
    monkeypatch, change
):
    """A person's approval starts (the service has checked ``decide_agentrun`` and is about to
    take the run's row lock) and pauses; meanwhile another thread changes what authorises it —
    the tool's approve permission, the configuration's approver group, the approver's
    membership — and commits. The decision then takes the lock: it is judged on the state as it
    stands then, not as it stood when the decision started."""
    change_authority, allowed = AUTHORITY_CHANGES[change]
    group = Group.objects.create(name="approvers")
    run = waiting_for_approval(script=WEBHOOK_SCRIPT, slug="hooks", approver_group=group)
    approver = UserFactory(username="approver", permissions=[DECIDE_PERMISSION, WEBHOOKS])
    if change != "approver joined the group":
        approver.groups.add(group)
    turn_digest = digest(run)

    at_lock, go_on = threading.Event(), threading.Event()
    lock_run = decision_transitions._lock_run

    def pausing_lock_run(run_uuid):  # the decision has started and not yet locked the row
        at_lock.set()
        assert go_on.wait(60), "the test never let the decision go on"
        return lock_run(run_uuid)

    monkeypatch.setattr(decision_transitions, "_lock_run", pausing_lock_run)
    outcome: dict[str, object] = {}

    def decide() -> None:
        try:
            person = get_user_model().objects.get(pk=approver.pk)  # as a request loads it
            outcome["result"] = runs.run_decide(
                run_uuid=run.uuid,
                actor=person,
                approved=True,
                turn_digest=turn_digest,
                mode="queued",
            )
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=decide)
    thread.start()
    try:
        give_up = time.monotonic() + 60
        while not at_lock.wait(0.02):
            assert thread.is_alive(), f"the decision ended before its row lock: {outcome}"
            assert time.monotonic() < give_up, "the decision never came to its row lock"
        change_authority(run, approver)  # committed (autocommit) before the lock is taken
    finally:
        go_on.set()
        thread.join(30)
    assert not thread.is_alive()

    if allowed:
        assert "error" not in outcome, outcome.get("error")
        [event] = decision_events(run, EventKind.APPROVAL)
        assert event.payload["authority"]["group"] == "approvers"
        assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED
    else:
        assert isinstance(outcome.get("error"), NotPermitted), outcome
        assert_unchanged(run, Status.WAITING_FOR_APPROVAL)
