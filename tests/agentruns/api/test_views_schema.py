"""The OpenAPI document: it validates, the docs pages serve without a CDN, and every documented
operation answers with a documented status and a body matching the documented schema."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from django.contrib.auth import get_user_model
from django.db.models.functions import Now
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from agentruns.models import AgentRun
from agentruns.services.runs import run_process_queued
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import (
    DECIDE,
    client_for,
    config,
    digest,
    in_doubt,
    waiting_for_approval,
    waiting_for_input,
)
from tests.agentruns.support.triggers import SECRET, SECRET_ENV, event_source, signed


@pytest.fixture
def api(db) -> APIClient:
    return client_for(
        UserFactory(username="decider", permissions=[DECIDE, "agentruns.start_agentrun"])
    )


@pytest.fixture
def schema(api) -> dict[str, Any]:
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def test_the_schema_is_valid_openapi(schema):
    validate_schema(schema)  # raises on an invalid document
    assert schema["openapi"].startswith("3.")


def test_the_schema_needs_staff(db):
    assert APIClient().get("/api/schema/").status_code == 401


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_are_self_contained(api, page):
    client = APIClient()
    client.force_login(UserFactory(username="reader"))
    response = client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()


# --- Walking the documented operations ------------------------------------------------------------


def _openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 schema objects → JSON Schema (``nullable`` becomes a ``null`` alternative)."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _openapi_to_jsonschema(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def assert_matches(schema: dict[str, Any], operation: dict[str, Any], response) -> None:
    documented = operation["responses"]
    assert str(response.status_code) in documented, (
        f"{operation['operationId']} answered {response.status_code}, "
        f"documented: {sorted(documented)}"
    )
    content = documented[str(response.status_code)].get("content", {})
    if not content:
        return
    if "application/json" not in content:  # the audit export: JSON Lines (tests/…/test_ledger)
        assert response["Content-Type"] in content
        return
    body_schema = copy.deepcopy(content["application/json"]["schema"])
    root = {
        **_openapi_to_jsonschema(body_schema),
        "components": _openapi_to_jsonschema(schema["components"]),
    }
    jsonschema.Draft7Validator(root).validate(response.json())


def _cases(api: APIClient) -> dict[str, list[tuple[str, str, dict | None, int]]]:
    """operationId → requests (method, path, body, expected status) that reach each answer."""
    config("hello", [{"content": "hi"}])
    approval = waiting_for_approval()
    inline = waiting_for_approval(slug="notes")
    doubt = in_doubt()
    asking = waiting_for_input()
    mine = waiting_for_approval(get_user_model().objects.get(username="decider"), slug="mine")
    # Approval deadlines (docs/design.md §5.11): one ahead, one passed.
    timed = waiting_for_approval(slug="timed", approval_timeout=timedelta(minutes=5))
    overdue = waiting_for_approval(slug="overdue", approval_timeout=timedelta(minutes=5))
    AgentRun.objects.filter(pk=overdue.pk).update(approval_deadline=Now() - timedelta(seconds=1))
    unknown = "00000000-0000-0000-0000-000000000000"
    return {
        "runs_list": [
            ("get", "/api/runs/?status=completed", None, 200),
            ("get", "/api/runs/?status=bogus", None, 400),
        ],
        "runs_start": [
            ("post", "/api/runs/", {"configuration": "hello", "prompt": "p"}, 200),
            (
                "post",
                "/api/runs/",
                {"configuration": "hello", "prompt": "p", "mode": "queued"},
                202,
            ),
            ("post", "/api/runs/", {"configuration": "nope", "prompt": "p"}, 400),
        ],
        "runs_retrieve": [
            ("get", f"/api/runs/{approval.uuid}/", None, 200),
            ("get", f"/api/runs/{doubt.uuid}/", None, 200),
            ("get", f"/api/runs/{timed.uuid}/", None, 200),
            ("get", f"/api/runs/{unknown}/", None, 404),
        ],
        "runs_events": [
            ("get", f"/api/runs/{approval.uuid}/events/?after=0", None, 200),
            ("get", f"/api/runs/{approval.uuid}/events/?after=x", None, 400),
            ("get", f"/api/runs/{unknown}/events/", None, 404),
        ],
        "runs_decide": [
            ("post", f"/api/runs/{approval.uuid}/decision/", {"approved": True}, 409),
            (
                "post",
                f"/api/runs/{approval.uuid}/decision/",
                {"approved": True, "turn_digest": digest(approval)},
                202,
            ),
            (
                "post",
                f"/api/runs/{inline.uuid}/decision/",
                {"approved": False, "turn_digest": digest(inline), "mode": "inline"},
                200,
            ),
            ("post", f"/api/runs/{approval.uuid}/decision/", {}, 400),
            (
                "post",
                f"/api/runs/{overdue.uuid}/decision/",
                {"approved": True, "turn_digest": digest(overdue)},
                409,
            ),
            ("post", f"/api/runs/{unknown}/decision/", {"approved": True}, 404),
        ],
        "runs_input": [
            ("post", f"/api/runs/{approval.uuid}/input/", {"values": {}}, 409),
            ("post", f"/api/runs/{approval.uuid}/input/", {}, 400),
            (
                "post",
                f"/api/runs/{asking.uuid}/input/",
                {"values": {"priority": [1]}, "turn_digest": digest(asking)},
                422,
            ),
        ],
        "runs_reconcile": [
            ("post", f"/api/runs/{doubt.uuid}/reconciliation/", {"verdict": "x"}, 400),
            ("post", f"/api/runs/{doubt.uuid}/reconciliation/", {"verdict": "landed"}, 409),
            (
                "post",
                f"/api/runs/{doubt.uuid}/reconciliation/",
                {"verdict": "abandon", "turn_digest": digest(doubt)},
                200,
            ),
        ],
        "runs_audit": [
            ("get", f"/api/runs/{doubt.uuid}/audit/", None, 200),
            ("get", f"/api/runs/{unknown}/audit/", None, 404),
        ],
        # Signed by the sender, not signed in (agentruns.api.events): 401 without a signature;
        # signed requests are in test_the_event_endpoint_answers_as_documented.
        "events_receive": [
            ("post", "/api/events/events/", {"id": "e"}, 401),
            ("post", "/api/events/nope/", {"id": "e"}, 404),
        ],
        "runs_cancel": [
            ("post", f"/api/runs/{mine.uuid}/cancel/", None, 200),
            # Someone else's run needs agentruns.cancel_agentrun (docs/design.md §12.1).
            ("post", f"/api/runs/{approval.uuid}/cancel/", None, 403),
            ("post", f"/api/runs/{unknown}/cancel/", None, 404),
        ],
    }


def _operations(schema: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return {
        operation["operationId"]: (method, path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }


def test_every_documented_operation_answers_as_documented(api, schema, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    event_source()
    operations = _operations(schema)
    cases = _cases(api)
    assert set(operations) == set(cases), "every documented operation needs a case here"
    anonymous = APIClient()
    for operation_id, requests in cases.items():
        method, _, operation = operations[operation_id]
        for case_method, path, body, expected in requests:
            assert case_method == method
            response = getattr(api, method)(path, body, format="json")
            assert response.status_code == expected, (operation_id, path, response.content)
            assert_matches(schema, operation, response)
        # And every operation refuses the anonymous in its documented way.
        response = getattr(anonymous, method)(requests[0][1], requests[0][2], format="json")
        assert_matches(schema, operation, response)
        assert response.status_code == 401


def test_the_event_endpoint_answers_as_documented(schema, monkeypatch):
    """Signed events: started (202), replayed (200), refused input (422), a reused id (409)."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    event_source()
    _, _, operation = _operations(schema)["events_receive"]
    client = APIClient()
    url = "/api/events/events/"
    start = signed({"id": "s", "correlation_key": "k", "data": {"n": 1}})
    for request, expected in [
        (start, 202),
        (start, 200),
        (signed({"id": "s", "data": {"n": 2}}), 409),
        (signed({"id": "i", "correlation_key": "k", "input": {"answer": "x"}}), 409),
        (signed(b"[]"), 400),
    ]:
        response = client.post(url, **request)
        assert response.status_code == expected, response.content
        assert_matches(schema, operation, response)
    run_process_queued(run_uuid=client.post(url, **start).json()["run"])
    refused = client.post(
        url, **signed({"id": "i", "correlation_key": "k", "input": {"priority": "x"}})
    )
    assert refused.status_code == 422
    assert_matches(schema, operation, refused)
