"""The API's limits (issue 11 §11): each is a typed refusal, never a 500 and never a huge page."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from agentruns.models import AgentRun
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def user(db):
    return UserFactory(
        username="staff",
        is_staff=True,
        permissions=["agentruns.decide_agentrun", "agentruns.start_agentrun"],
    )


@pytest.fixture
def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    AgentConfigurationFactory(slug="hello", script=[{"content": "hi"}])
    return client


def test_a_prompt_over_the_limit_is_a_typed_400(api):
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MAX_PROMPT_CHARS": 10}):
        response = api.post(
            "/api/runs/", {"configuration": "hello", "prompt": "x" * 11}, format="json"
        )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert "at most 10" in response.json()["message"]
    assert not AgentRun.objects.exists()


def test_a_body_over_djangos_limit_is_a_typed_413(api):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100):
        response = api.post(
            "/api/runs/", {"configuration": "hello", "prompt": "x" * 500}, format="json"
        )
    assert response.status_code == 413
    assert response.json()["code"] == "request_too_large"
    assert not AgentRun.objects.exists()


def test_the_run_list_cuts_prompts_and_outputs_and_caps_its_pages(api, user):
    for _ in range(3):
        AgentRunFactory(initiator=user, prompt="p" * 5000, output="o" * 5000, completed=True)

    body = api.get("/api/runs/?page_size=100000").json()

    assert len(body["results"]) == 3
    run = body["results"][0]
    assert len(run["prompt"]) == 500 and run["prompt_truncated"] is True
    assert len(run["output"]) == 500 and run["output_truncated"] is True
    detail = api.get(f"/api/runs/{run['uuid']}/").json()
    assert len(detail["prompt"]) == 5000
    for _ in range(205):
        AgentRunFactory(initiator=user)
    assert len(api.get("/api/runs/?page_size=100000").json()["results"]) == 200
