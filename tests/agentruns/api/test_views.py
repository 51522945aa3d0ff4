"""The HTTP API (docs/design.md §11.2): every endpoint, every refusal, and the typed JSON errors."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agentruns.models import AgentRun, AgentRunEvent, EventKind, Provider, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import (
    DECIDE,
    assert_error,
    client_for,
    config,
    digest,
    in_doubt,
    waiting_for_approval,
    waiting_for_input,
)

START = "agentruns.start_agentrun"
RAW_STATE = {"loop_state", "request"}


@pytest.fixture
def decider(db):
    return UserFactory(username="decider", permissions=[DECIDE, START])


@pytest.fixture
def api(decider) -> APIClient:
    return client_for(decider)


# --- Authentication and permissions -------------------------------------------------------------


def test_anonymous_requests_get_401_with_the_typed_error(db):
    response = APIClient().get("/api/runs/")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Token"


def test_a_wrong_token_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    assert_error(client.get("/api/runs/"), 401, "authentication_failed")


def test_non_staff_users_are_refused_on_every_endpoint(db):
    client = client_for(UserFactory(username="outsider", is_staff=False, permissions=[DECIDE]))
    assert_error(client.get("/api/runs/"), 403, "permission_denied")
    assert_error(client.post("/api/runs/", {}, format="json"), 403, "permission_denied")
    assert_error(client.get(f"/api/runs/{uuid.uuid4()}/"), 403, "permission_denied")


def test_session_authentication_works_for_staff(decider):
    client = APIClient()
    client.force_login(decider)
    assert client.get("/api/runs/").status_code == 200


def test_session_posts_need_the_csrf_token(decider):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(decider)
    config("notes", [{"content": "hi"}])
    response = client.post("/api/runs/", {"configuration": "notes", "prompt": "p"}, format="json")
    assert_error(response, 403, "permission_denied")
    assert "CSRF" in response.json()["message"]


# --- Starting --------------------------------------------------------------------------------


def test_sync_start_answers_200_with_the_finished_run(api, decider):
    config("hello", [{"content": "hi there"}])
    response = api.post("/api/runs/", {"configuration": "hello", "prompt": "say hi"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "completed"
    assert body["termination_reason"] == "completed"
    assert body["output"] == "hi there"
    assert body["configuration"] == "hello"
    assert body["initiator"] == "decider"
    assert body["pending_turn"] is None
    assert body["iterations"] == 1 and body["total_tokens"] > 0
    assert not RAW_STATE & set(body)
    for column in ["claimed_by", "lease_expires", "lease_epoch", "pending_effect", "requeue_count"]:
        assert column in body
    assert AgentRun.objects.get(uuid=body["uuid"]).initiator == decider


def test_a_script_in_the_request_overrides_the_configuration(api):
    config("hello", [{"content": "from the configuration"}])
    response = api.post(
        "/api/runs/",
        {"configuration": "hello", "prompt": "p", "script": [{"content": "from the request"}]},
        format="json",
    )
    assert response.json()["output"] == "from the request"


def test_queued_start_answers_202_and_leaves_the_run_for_a_worker(api):
    from django_q.models import OrmQ

    config("hello", [{"content": "hi"}])
    with pytest.MonkeyPatch.context() as patch:
        # on_commit callbacks do not run inside the test transaction: send at once.
        patch.setattr("django.db.transaction.on_commit", lambda func, **kw: func())
        response = api.post(
            "/api/runs/", {"configuration": "hello", "prompt": "p", "mode": "queued"}, format="json"
        )
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) == {"uuid", "status"}
    assert body["status"] == "queued"
    assert AgentRun.objects.get(uuid=body["uuid"]).status == Status.QUEUED
    assert OrmQ.objects.count() == 1


@pytest.mark.parametrize(
    "payload, code",
    [
        ({"prompt": "p"}, "invalid_request"),
        ({"configuration": "hello"}, "invalid_request"),
        ({"configuration": "hello", "prompt": "p", "mode": "later"}, "invalid_request"),
        ({"configuration": "hello", "prompt": "p", "script": "nope"}, "invalid_request"),
        ({"configuration": "nope", "prompt": "p"}, "configuration_not_found"),
        ({"configuration": "hello", "prompt": "   "}, "invalid_request"),
    ],
)
def test_malformed_starts_are_400_and_create_nothing(api, payload, code):
    config("hello", [{"content": "hi"}])
    body = assert_error(api.post("/api/runs/", payload, format="json"), 400, code)
    if code == "invalid_request" and "errors" in body:
        assert isinstance(body["errors"], dict)
    assert not AgentRun.objects.exists()


def test_a_script_for_a_non_scripted_provider_is_400(api):
    config("real", [], provider=Provider.OPENAI)
    response = api.post(
        "/api/runs/",
        {"configuration": "real", "prompt": "p", "script": [{"content": "x"}]},
        format="json",
    )
    assert_error(response, 400, "invalid_request")
    assert not AgentRun.objects.exists()


def test_a_body_that_is_not_json_is_400(api):
    response = api.generic("POST", "/api/runs/", "{not json", content_type="application/json")
    assert_error(response, 400, "parse_error")


# --- Reading ---------------------------------------------------------------------------------


def test_list_is_paginated_newest_first_and_filters(api):
    config("a", [{"content": "x"}])
    config("b", [{"content": "x"}])
    for slug in ["a", "a", "b"]:
        runs.run_start_sync(configuration=slug, prompt="p")
    waiting = waiting_for_approval()

    assert len(api.get("/api/runs/").json()["results"]) == 4
    page = api.get("/api/runs/?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]
    assert page["results"][0]["uuid"] == str(waiting.uuid)
    second = api.get("/api/runs/?page_size=2&page=2").json()
    assert len(second["results"]) == 2 and second["previous"]

    by_config = api.get("/api/runs/?configuration=a").json()
    assert by_config["count"] == 2
    assert {r["configuration"] for r in by_config["results"]} == {"a"}
    by_status = api.get("/api/runs/?status=waiting_for_approval").json()
    assert [r["uuid"] for r in by_status["results"]] == [str(waiting.uuid)]
    assert api.get("/api/runs/?status=completed&configuration=b").json()["count"] == 1


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=", "status"),
        ("configuration=", "configuration"),
        ("page_size=ten", "page_size"),
        ("page_size=0", "page_size"),
        ("page=", "page"),
        ("page=0", "page"),
        ("page=last", "page"),
    ],
)
def test_a_blank_or_malformed_list_parameter_is_400_naming_it(api, query, field):
    """``?status=`` is not "every status" and ``?page_size=ten`` is not the default size."""
    body = assert_error(api.get(f"/api/runs/?{query}"), 400, "invalid_request")
    assert list(body["errors"]) == [field]


@pytest.mark.parametrize("after", ["", "1e3", str(2**31), str(10**30), "-2"])
def test_a_blank_or_out_of_range_events_cursor_is_400(api, after):
    run = waiting_for_approval()
    body = assert_error(
        api.get(f"/api/runs/{run.uuid}/events/?after={after}"), 400, "invalid_request"
    )
    assert list(body["errors"]) == ["after"]


def test_a_page_past_the_last_is_a_documented_404(api):
    config("a", [{"content": "x"}])
    runs.run_start_sync(configuration="a", prompt="p")
    assert_error(api.get("/api/runs/?page=2"), 404, "not_found")
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "404" in schema["paths"]["/api/runs/"]["get"]["responses"]


def test_an_unknown_status_filter_is_400(api):
    assert_error(api.get("/api/runs/?status=sleeping"), 400, "invalid_request")


def test_a_page_past_the_end_is_404(api):
    assert_error(api.get("/api/runs/?page=9"), 404, "not_found")


def test_detail_shows_the_pending_turn_without_raw_state(api):
    run = waiting_for_approval()
    body = api.get(f"/api/runs/{run.uuid}/").json()
    assert body["status"] == "waiting_for_approval"
    assert not RAW_STATE & set(body)
    turn = body["pending_turn"]
    assert turn["kind"] == "approval"
    assert turn["turn_digest"] == digest(run)
    assert turn["calls"] == [
        {
            "id": turn["calls"][0]["id"],
            "name": "create_note",
            "arguments": {"title": "t", "body": "b"},
            "effect": "non_idempotent_write",
            "tool": {
                "description": "Create a new note. Each call creates another note, even with "
                "the same text.",
                "source": "local",
                "server": None,
                "hints": {},
                "hints_note": "",
                "read_only_by_operator": False,
            },
            "preview": {
                "summary": "creates a note titled 't'",
                "target": None,
                "changes": [
                    {"field": "title", "before": None, "after": "t"},
                    {"field": "body", "before": None, "after": "b"},
                ],
            },
            "preview_failed": None,
            "edit": None,
        }
    ]


def test_detail_of_a_run_waiting_for_input_shows_the_input_request(api):
    run = waiting_for_input()
    turn = api.get(f"/api/runs/{run.uuid}/").json()["pending_turn"]
    assert turn["kind"] == "input"
    assert turn["calls"][0]["name"] == "ask_human"
    assert turn["input_schema"]["required"] == ["answer"]
    assert turn["field_order"] == ["answer", "priority"]  # as ask_human declares them
    assert turn["turn_digest"] == digest(run)


def test_detail_of_an_in_doubt_run_shows_the_call_in_flight(api):
    run = in_doubt()
    turn = api.get(f"/api/runs/{run.uuid}/").json()["pending_turn"]
    assert turn["kind"] == "reconciliation"
    assert turn["calls"][0]["name"] == "create_note"
    assert turn["idempotency_key"] == f"{run.uuid}:call_0_0"


@pytest.mark.parametrize("path", ["", "events/"])
@pytest.mark.parametrize("run_id", [str(uuid.uuid4()), "not-a-uuid"])
def test_unknown_runs_are_404(api, path, run_id):
    assert_error(api.get(f"/api/runs/{run_id}/{path}"), 404, "run_not_found")


def test_events_after_n(api):
    run = waiting_for_approval()
    every = api.get(f"/api/runs/{run.uuid}/events/").json()
    assert [e["sequence"] for e in every] == list(range(len(every)))
    assert {"request", "llm"} <= {e["kind"] for e in every}
    later = api.get(f"/api/runs/{run.uuid}/events/?after=1").json()
    assert [e["sequence"] for e in later] == list(range(2, len(every)))
    assert api.get(f"/api/runs/{run.uuid}/events/?after={len(every)}").json() == []


@pytest.mark.parametrize("after", ["x", "-5"])
def test_events_with_a_bad_after_are_400(api, after):
    run = waiting_for_approval()
    assert_error(api.get(f"/api/runs/{run.uuid}/events/?after={after}"), 400, "invalid_request")


# --- Decisions -------------------------------------------------------------------------------


def decide(api, run, **body):
    return api.post(f"/api/runs/{run.uuid}/decision/", body, format="json")


def test_a_queued_approval_answers_202_and_hands_the_run_to_a_worker(api):
    run = waiting_for_approval()
    response = decide(api, run, approved=True, turn_digest=digest(run))
    assert response.status_code == 202, response.content
    assert response.json() == {"uuid": str(run.uuid), "status": "queued"}
    run.refresh_from_db()
    assert run.status == Status.QUEUED
    assert run.events.filter(kind=EventKind.APPROVAL).count() == 1
    assert not Note.objects.exists()


def test_an_inline_approval_answers_200_with_the_run_after_the_continuation(api):
    run = waiting_for_approval()
    response = decide(api, run, approved=True, turn_digest=digest(run), mode="inline")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "completed" and body["output"] == "created"
    assert Note.objects.count() == 1


def test_an_inline_denial_runs_nothing(api):
    run = waiting_for_approval()
    response = decide(api, run, approved=False, turn_digest=digest(run), mode="inline")
    assert response.status_code == 200
    assert response.json()["status"] == "completed"
    assert not Note.objects.exists()
    tool = run.events.get(kind=EventKind.TOOL)
    assert tool.payload["outcome"] == "denied"


def test_a_missing_digest_is_409_and_changes_nothing(api):
    run = waiting_for_approval()
    assert_error(decide(api, run, approved=True), 409, "stale_turn")
    assert_error(decide(api, run, approved=True, turn_digest=""), 409, "stale_turn")
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()


def test_a_stale_digest_is_409(api):
    run = waiting_for_approval()
    assert_error(decide(api, run, approved=True, turn_digest="0" * 64), 409, "stale_turn")
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_a_second_decision_is_409_already_decided(api):
    run = waiting_for_approval()
    turn_digest = digest(run)
    assert decide(api, run, approved=True, turn_digest=turn_digest).status_code == 202
    assert_error(decide(api, run, approved=False, turn_digest=turn_digest), 409, "already_decided")


def test_deciding_a_run_that_does_not_wait_is_409_not_waiting(api):
    config("hello", [{"content": "hi"}])
    run = runs.run_start_sync(configuration="hello", prompt="p").run
    assert_error(decide(api, run, approved=True, turn_digest="d" * 64), 409, "not_waiting")


def test_deciding_without_the_permission_is_403_not_permitted(db):
    run = waiting_for_approval()
    client = client_for(UserFactory(username="viewer"))
    assert_error(decide(client, run, approved=True, turn_digest=digest(run)), 403, "not_permitted")
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL


def test_four_eyes_refuses_self_approval_but_allows_self_denial(api, decider):
    run = waiting_for_approval(user=decider, require_second_approver=True)
    turn_digest = digest(run)
    assert_error(
        decide(api, run, approved=True, turn_digest=turn_digest), 403, "self_approval_refused"
    )
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    assert decide(api, run, approved=False, turn_digest=turn_digest).status_code == 202


def test_a_decision_without_approved_is_400(api):
    run = waiting_for_approval()
    assert_error(decide(api, run, turn_digest=digest(run)), 400, "invalid_request")
    assert_error(
        decide(api, run, approved=True, turn_digest=digest(run), mode="later"),
        400,
        "invalid_request",
    )


def test_deciding_an_unknown_run_is_404(api):
    response = api.post(
        f"/api/runs/{uuid.uuid4()}/decision/", {"approved": True, "turn_digest": "x"}, format="json"
    )
    assert_error(response, 404, "run_not_found")


# --- Input -----------------------------------------------------------------------------------


def submit(api, run, **body):
    return api.post(f"/api/runs/{run.uuid}/input/", body, format="json")


def test_invalid_input_values_are_422_and_change_nothing(api):
    run = waiting_for_input()
    body = assert_error(
        submit(api, run, values={"priority": "high"}, turn_digest=digest(run)),
        422,
        "invalid_input",
    )
    assert body["errors"] == [
        {"path": [], "message": "'answer' is a required property"},
        {"path": ["priority"], "message": "'high' is not of type 'integer'"},
    ]
    # Values that are not an object break the API's own document (``values`` is an object):
    # refused by the request's validation before the input schema is consulted.
    body = assert_error(
        submit(api, run, values=["x"], turn_digest=digest(run)), 400, "invalid_request"
    )
    assert body["errors"] == {"values": ["Expected a JSON object."]}
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    assert not run.events.filter(kind=EventKind.INPUT).exists()


def test_valid_input_inline_continues_the_run(api):
    run = waiting_for_input()
    response = submit(
        api, run, values={"answer": "blue", "priority": 1}, turn_digest=digest(run), mode="inline"
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "completed"
    tool = run.events.get(kind=EventKind.TOOL)
    assert tool.payload["result"]["answer"] == "blue"


def test_valid_input_queued_is_202(api):
    run = waiting_for_input()
    response = submit(api, run, values={"answer": "blue"}, turn_digest=digest(run))
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


def test_input_refusals(api, db):
    run = waiting_for_input()
    assert_error(submit(api, run, values={"answer": "x"}), 409, "stale_turn")
    assert_error(submit(api, run, turn_digest=digest(run)), 400, "invalid_request")
    approval = waiting_for_approval()
    assert_error(
        submit(api, approval, values={"answer": "x"}, turn_digest=digest(approval)),
        409,
        "not_waiting",
    )
    viewer = client_for(UserFactory(username="viewer"))
    assert_error(
        submit(viewer, run, values={"answer": "x"}, turn_digest=digest(run)), 403, "not_permitted"
    )


# --- Reconciliation ----------------------------------------------------------------------------


def reconcile(api, run, **body):
    return api.post(f"/api/runs/{run.uuid}/reconciliation/", body, format="json")


def test_reconcile_landed_inline_continues(api):
    run = in_doubt()
    response = reconcile(api, run, verdict="landed", turn_digest=digest(run), mode="inline")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "completed"
    assert run.events.filter(kind=EventKind.RECONCILIATION).count() == 1
    assert not Note.objects.exists()  # the write is never re-executed


def test_reconcile_not_landed_queued_is_202(api):
    run = in_doubt()
    response = reconcile(api, run, verdict="not_landed", turn_digest=digest(run))
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


def test_reconcile_abandon_settles_the_run(api):
    run = in_doubt()
    response = reconcile(api, run, verdict="abandon", turn_digest=digest(run))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "failed" and body["termination_reason"] == "reconciled_abandoned"


def test_reconciliation_refusals(api):
    run = in_doubt()
    assert_error(
        reconcile(api, run, verdict="maybe", turn_digest=digest(run)), 400, "invalid_request"
    )
    assert_error(reconcile(api, run, verdict="landed", turn_digest="0" * 64), 409, "stale_turn")
    assert_error(reconcile(api, run, verdict="landed"), 409, "stale_turn")
    approval = waiting_for_approval()
    assert_error(
        reconcile(api, approval, verdict="landed", turn_digest=digest(approval)),
        409,
        "not_waiting",
    )
    viewer = client_for(UserFactory(username="viewer"))
    assert_error(
        reconcile(viewer, run, verdict="landed", turn_digest=digest(run)), 403, "not_permitted"
    )
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_RECONCILIATION


# --- Cancel ----------------------------------------------------------------------------------


def test_cancel_answers_whether_it_cancelled(api, decider):
    run = waiting_for_approval(decider)  # their own run (others': test_views_access.py)
    response = api.post(f"/api/runs/{run.uuid}/cancel/")
    assert response.status_code == 200
    assert response.json() == {"cancelled": True}
    run.refresh_from_db()
    assert run.status == Status.CANCELLED
    assert run.events.get(kind=EventKind.CANCEL).actor == decider
    assert api.post(f"/api/runs/{run.uuid}/cancel/").json() == {"cancelled": False}


def test_cancelling_an_unknown_run_is_404(api):
    assert_error(api.post(f"/api/runs/{uuid.uuid4()}/cancel/"), 404, "run_not_found")


def test_wrong_methods_are_405_in_the_same_shape(api):
    assert_error(api.delete("/api/runs/"), 405, "method_not_allowed")


# --- Races -------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_decisions_exactly_one_wins(decider):
    """One request wins; every other gets 409 ``already_decided`` — never ``not_waiting``, which
    is what a decision checked without the row lock answers (the losers pass the check on the
    row as it was and only the guarded UPDATE refuses them)."""
    run = waiting_for_approval()
    turn_digest = digest(run)
    token = Token.objects.create(user=decider).key
    barrier = threading.Barrier(16)
    statuses: list[int] = []
    refusals: list[str] = []
    lock = threading.Lock()

    def attempt(index: int) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
            barrier.wait(timeout=30)
            response = client.post(
                f"/api/runs/{run.uuid}/decision/",
                {
                    "approved": index % 2 == 0,
                    "turn_digest": turn_digest,
                    "mode": "inline" if index % 4 == 0 else "queued",
                },
                format="json",
            )
            with lock:
                statuses.append(response.status_code)
                if response.status_code >= 400:
                    refusals.append(response.json().get("code"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(statuses) == 16
    assert sum(200 <= status < 300 for status in statuses) == 1, statuses
    assert set(statuses) - {200, 202} == {409}
    assert refusals == ["already_decided"] * 15, refusals
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL).count() == 1
    assert Note.objects.count() <= 1
