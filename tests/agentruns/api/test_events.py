"""``POST /api/events/<slug>/`` over HTTP: signed, not signed in; replayed, answered once."""

from __future__ import annotations

import json
import time

import pytest
from rest_framework.test import APIClient

from agentruns import event_requests
from agentruns.models import AgentRun, ReceivedEvent, Status
from agentruns.services.runs import run_process_queued
from tests.agentruns.support.triggers import SECRET, SECRET_ENV, event_source, signed

pytestmark = pytest.mark.django_db

URL = "/api/events/events/"


@pytest.fixture
def client(monkeypatch) -> APIClient:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    event_source()
    return APIClient()


def test_a_signed_event_starts_a_run_202_and_its_replay_answers_200_with_the_same_run(client):
    request = signed({"id": "evt-1", "data": {"order": 42}})

    first = client.post(URL, **request)
    again = client.post(URL, **request)

    assert first.status_code == 202, first.content
    assert first.json() == {
        "event": "evt-1",
        "action": "started",
        "run": first.json()["run"],
        "replayed": False,
    }
    assert again.status_code == 200
    assert again.json() == {**first.json(), "replayed": True}
    assert AgentRun.objects.count() == 1


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: {**r, "HTTP_X_LEASEHOLD_SIGNATURE": "v1=" + "0" * 64},
        lambda r: {k: v for k, v in r.items() if k != "HTTP_X_LEASEHOLD_SIGNATURE"},
        lambda r: {k: v for k, v in r.items() if k != "HTTP_X_LEASEHOLD_TIMESTAMP"},
        lambda r: {**r, "data": r["data"].replace(b"42", b"43")},
        lambda r: {**r, "HTTP_X_LEASEHOLD_TIMESTAMP": str(int(time.time()) + 1)},
    ],
    ids=["wrong", "no-signature", "no-timestamp", "body-changed", "timestamp-changed"],
)
def test_a_bad_signature_is_401_and_starts_nothing(client, tamper):
    response = client.post(URL, **tamper(signed({"id": "evt-1", "data": {"order": 42}})))
    assert response.status_code == 401, response.content
    assert response.json()["code"] == "bad_signature"
    assert not AgentRun.objects.exists() and not ReceivedEvent.objects.exists()


def test_a_recorded_event_replayed_after_five_minutes_is_401(client):
    old = signed({"id": "evt-1"}, at=time.time() - event_requests.TOLERANCE_SECONDS - 5)
    response = client.post(URL, **old)
    assert response.status_code == 401
    assert "300 seconds" in response.json()["message"]


def test_a_session_or_token_is_not_what_authenticates_an_event(client, admin_user):
    client.force_authenticate(admin_user)
    assert client.post(URL, {"id": "evt-1"}, format="json").status_code == 401


def test_an_unknown_configuration_or_one_without_a_source_is_404(client, monkeypatch):
    assert client.post("/api/events/nope/", **signed({"id": "e"})).status_code == 404
    monkeypatch.delenv(SECRET_ENV)
    response = client.post(URL, **signed({"id": "e"}))
    assert (response.status_code, response.json()["code"]) == (404, "event_source_not_found")


def test_a_body_over_the_limit_is_413_unread(client):
    body = json.dumps({"id": "e", "data": "x" * event_requests.MAX_BODY_BYTES}).encode()
    response = client.post(URL, **signed(body))
    assert (response.status_code, response.json()["code"]) == (413, "request_too_large")


@pytest.mark.parametrize(
    "body",
    [b"[]", b'{"id": "e", "data": ' + b"[" * 50 + b"]" * 50 + b"}", b'{"id": "e", "x": 1}'],
)
def test_a_signed_body_that_is_not_an_event_is_400(client, body):
    response = client.post(URL, **signed(body))
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")


def test_input_by_correlation_key_over_http(client):
    started = client.post(URL, **signed({"id": "s", "correlation_key": "k-1", "data": {}}))
    run_process_queued(run_uuid=started.json()["run"])
    assert AgentRun.objects.get().status == Status.WAITING_FOR_INPUT

    bad = client.post(
        URL, **signed({"id": "i", "correlation_key": "k-1", "input": {"priority": "high"}})
    )
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid_input")
    assert AgentRun.objects.get().status == Status.WAITING_FOR_INPUT

    good = client.post(
        URL, **signed({"id": "i", "correlation_key": "k-1", "input": {"answer": "blue"}})
    )
    assert good.status_code == 202 and good.json()["action"] == "input"
    assert AgentRun.objects.get().status == Status.QUEUED
