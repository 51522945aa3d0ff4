"""Who may do what through the API (docs/design.md §12.1): approver authority (403
``not_permitted`` naming what is missing) and ownership (a run one may not see is 404 and never
listed; cancel rules)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from agentruns.models import AgentRun, EventKind, Status
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import (
    WEBHOOK_CALL,
    WEBHOOK_SCRIPT,
    assert_error,
    client_for,
    config,
    digest,
    in_doubt,
    waiting_for_approval,
)

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
VIEW_ALL = "agentruns.view_all_agentruns"
CANCEL = "agentruns.cancel_agentrun"
WEBHOOKS = "playground.approve_webhooks"


def decide(client, run: AgentRun, **body):
    return client.post(f"/api/runs/{run.uuid}/decision/", body, format="json")


def reconcile(client, run: AgentRun, **body):
    return client.post(f"/api/runs/{run.uuid}/reconciliation/", body, format="json")


def cancel(client, run: AgentRun):
    return client.post(f"/api/runs/{run.uuid}/cancel/")


# --- Approver authority --------------------------------------------------------------------------


def test_approving_a_webhook_without_its_permission_is_403_naming_it():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    colleague = client_for(UserFactory(username="colleague", permissions=[DECIDE]))

    body = assert_error(
        decide(colleague, run, approved=True, turn_digest=digest(run)), 403, "not_permitted"
    )

    assert body["message"] == "approving call_webhook needs playground.approve_webhooks"
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    # Denying needs no more than deciding.
    assert decide(colleague, run, approved=False, turn_digest=digest(run)).status_code == 202


def test_approving_with_the_permission_records_it_in_the_event():
    run = waiting_for_approval(script=WEBHOOK_SCRIPT)
    approver = client_for(UserFactory(username="approver", permissions=[DECIDE, WEBHOOKS]))

    assert decide(approver, run, approved=True, turn_digest=digest(run)).status_code == 202

    event = run.events.get(kind=EventKind.APPROVAL)
    assert event.payload["authority"] == {"permissions": [DECIDE, WEBHOOKS], "group": None}
    assert approver.get(f"/api/runs/{run.uuid}/events/").json()[-1]["payload"]["authority"]


def test_a_configuration_s_group_is_403_for_a_non_member():
    group = Group.objects.create(name="approvers")
    run = waiting_for_approval(slug="grouped", approver_group=group)
    user = UserFactory(username="colleague", permissions=[DECIDE])

    body = assert_error(
        decide(client_for(user), run, approved=True, turn_digest=digest(run)),
        403,
        "not_permitted",
    )
    assert body["message"] == "approving runs of grouped needs membership of the group 'approvers'"

    user.groups.add(group)
    assert decide(client_for(user), run, approved=True, turn_digest=digest(run)).status_code == 202


def test_a_turn_calling_an_unregistered_tool_is_403_for_everyone():
    script = [{"tool_calls": [{"name": "retired_tool", "arguments": {}}]}, {"content": "x"}]
    run = waiting_for_approval(script=script)
    root = client_for(UserFactory(username="root", is_superuser=True))

    body = assert_error(
        decide(root, run, approved=True, turn_digest=digest(run)), 403, "not_permitted"
    )
    assert "retired_tool" in body["message"]


def test_a_landed_verdict_on_a_webhook_is_403_naming_the_permission_and_abandon_is_not():
    run = in_doubt(call=WEBHOOK_CALL)
    colleague = client_for(UserFactory(username="colleague", permissions=[DECIDE]))

    body = assert_error(
        reconcile(colleague, run, verdict="landed", turn_digest=digest(run)), 403, "not_permitted"
    )
    assert body["message"] == "reconciling call_webhook needs playground.approve_webhooks"

    response = reconcile(colleague, run, verdict="abandon", turn_digest=digest(run))
    assert response.status_code == 200 and response.json()["status"] == "failed"


# --- Ownership: who sees what ---------------------------------------------------------------------


@pytest.fixture
def alice(db):
    return UserFactory(username="alice")


@pytest.fixture
def two_runs(alice):
    bob = UserFactory(username="bob")
    return waiting_for_approval(alice), waiting_for_approval(bob)


def test_the_list_shows_a_user_only_their_own_runs(alice, two_runs):
    mine, _ = two_runs
    body = client_for(alice).get("/api/runs/").json()
    assert body["count"] == 1 and [r["uuid"] for r in body["results"]] == [str(mine.uuid)]
    filtered = client_for(alice).get("/api/runs/?status=waiting_for_approval").json()
    assert [r["uuid"] for r in filtered["results"]] == [str(mine.uuid)]


@pytest.mark.parametrize("permission", [DECIDE, VIEW_ALL])
def test_deciders_and_viewers_see_every_run(two_runs, permission):
    client = client_for(UserFactory(username="staff", permissions=[permission]))
    assert client.get("/api/runs/").json()["count"] == 2
    for run in two_runs:
        assert client.get(f"/api/runs/{run.uuid}/").status_code == 200
        assert client.get(f"/api/runs/{run.uuid}/events/").status_code == 200


@pytest.mark.parametrize("path", ["", "events/"])
def test_another_s_run_is_404_in_detail_and_events(alice, two_runs, path):
    mine, theirs = two_runs
    client = client_for(alice)
    assert client.get(f"/api/runs/{mine.uuid}/{path}").status_code == 200
    body = assert_error(client.get(f"/api/runs/{theirs.uuid}/{path}"), 404, "run_not_found")
    assert body == {"code": "run_not_found", "message": "No such run."}  # as for no run at all


# --- Cancel ---------------------------------------------------------------------------------------


def test_the_initiator_cancels_their_own_run(alice, two_runs):
    mine, _ = two_runs
    assert cancel(client_for(alice), mine).json() == {"cancelled": True}


def test_another_s_run_is_404_to_cancel_for_who_cannot_see_it(alice, two_runs):
    _, theirs = two_runs
    assert_error(cancel(client_for(alice), theirs), 404, "run_not_found")
    assert AgentRun.objects.get(pk=theirs.pk).status == Status.WAITING_FOR_APPROVAL


def test_cancelling_another_s_run_is_403_without_the_cancel_permission(two_runs):
    _, theirs = two_runs
    viewer = client_for(UserFactory(username="viewer", permissions=[VIEW_ALL]))
    body = assert_error(cancel(viewer, theirs), 403, "not_permitted")
    assert (
        body["message"] == "cancelling a run someone else started needs agentruns.cancel_agentrun"
    )

    canceller = client_for(UserFactory(username="canceller", permissions=[VIEW_ALL, CANCEL]))
    assert cancel(canceller, theirs).json() == {"cancelled": True}


def test_cancelling_one_s_own_run_in_doubt_needs_the_decide_permission(alice):
    run = in_doubt(alice)
    body = assert_error(cancel(client_for(alice), run), 403, "not_permitted")
    assert "agentruns.decide_agentrun" in body["message"]
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_RECONCILIATION

    alice.user_permissions.add(Permission.objects.get(codename="decide_agentrun"))
    assert cancel(client_for(alice), run).json() == {"cancelled": True}


# --- Starting ------------------------------------------------------------------------------------

START = "agentruns.start_agentrun"


@pytest.mark.parametrize("mode", ["sync", "queued"])
def test_starting_a_run_needs_the_start_permission(mode):
    """``POST /api/runs/`` needs ``agentruns.start_agentrun``, as the playground's Run buttons do;
    being staff (even a decider) is not enough. A refusal starts nothing."""
    config_body = {"configuration": "hello", "prompt": "say hi", "mode": mode}
    config("hello", [{"content": "hi"}])
    staff = client_for(UserFactory(username="staff", permissions=[DECIDE, VIEW_ALL]))
    body = assert_error(staff.post("/api/runs/", config_body, format="json"), 403, "not_permitted")
    assert body["message"] == f"starting a run needs {START}"
    assert not AgentRun.objects.exists()

    starter = client_for(UserFactory(username="starter", permissions=[START]))
    response = starter.post("/api/runs/", config_body, format="json")
    assert response.status_code == (200 if mode == "sync" else 202), response.content
    run = AgentRun.objects.get()
    assert run.initiator.username == "starter"
    # Their own run is theirs to see, as any initiator's.
    assert starter.get(f"/api/runs/{run.uuid}/").status_code == 200
    assert client_for(UserFactory(username="root", is_superuser=True)).post(
        "/api/runs/", config_body, format="json"
    ).status_code in (200, 202)
