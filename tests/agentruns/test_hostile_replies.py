"""Hostile values from a provider or an API client never reach the database as a 500 (issue 11
§5): token counts are checked, a scripted delay is bounded, and the API refuses JSON that cannot
be stored."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from agentruns.models import AgentRun, Status, TerminationReason
from agentruns.providers.base import ProviderError
from agentruns.providers.scripted import validate_script
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("count", [10**20, -5, 2**31])
def test_an_impossible_token_count_fails_the_run_instead_of_breaking_it(count):
    configuration = AgentConfigurationFactory(
        script=[{"content": "hi", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}]
    )
    configuration.script[0]["usage"]["prompt_tokens"] = count  # past the script's own check
    AgentConfigurationFactory._meta.model.objects.filter(pk=configuration.pk).update(
        script=configuration.script
    )

    result = runs.run_start_sync(configuration=configuration.slug, prompt="p")

    assert result.outcome == Outcome.FAILED
    run = AgentRun.objects.get()
    assert (run.status, run.termination_reason) == (
        Status.FAILED,
        TerminationReason.PROVIDER_FAILED,
    )
    assert run.error["type"] == "ProviderError:bad_response"
    assert run.claimed_by == ""


def test_a_scripted_delay_longer_than_the_tool_timeout_is_refused():
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "TOOL_TIMEOUT_SECONDS": 2}):
        with pytest.raises(ProviderError, match="may not exceed the tool timeout"):
            validate_script([{"content": "slow", "delay": 3}])
        validate_script([{"content": "fine", "delay": 2}])


@pytest.fixture
def api(db) -> APIClient:
    client = APIClient()
    client.force_authenticate(
        UserFactory(
            is_staff=True,
            permissions=["agentruns.decide_agentrun", "agentruns.start_agentrun"],
        )
    )
    AgentConfigurationFactory(slug="hello", script=[{"content": "hi"}])
    return client


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"configuration": "hello", "prompt": "a \\ud800 b"}', "lone surrogate"),
        ('{"configuration": "hello", "prompt": "a \\u0000 b"}', "NUL"),
        (
            '{"configuration": "hello", "prompt": "p", "script": ' + "[" * 5000 + "]" * 5000 + "}",
            "nested",
        ),
    ],
    ids=["surrogate", "nul", "deep"],
)
def test_the_api_refuses_json_that_cannot_be_stored(api, body, problem):
    response = api.post("/api/runs/", body, content_type="application/json")

    assert response.status_code == 400, response.content[:200]
    assert response.json()["code"] == "parse_error"
    assert problem in response.json()["message"]
    assert not AgentRun.objects.exists()
