"""Hostile values from a person or an API client never reach the database as a 5xx: every number
has a finite bound and JSON that cannot be stored is refused with a 400 or a form error naming
what is wrong (``agentruns.storable``), before anything is written."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib import admin
from django.test import override_settings
from rest_framework.test import APIClient

from agentruns.exceptions import InvalidRequest
from agentruns.models import AgentConfiguration, AgentRun
from agentruns.models.configuration import MAX_APPROVAL_TIMEOUT
from agentruns.providers.base import ProviderError
from agentruns.providers.scripted import validate_script
from agentruns.services import runs
from agentruns.transitions.deadlines import WaitDeadline
from playground.forms import RunForm
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

pytestmark = pytest.mark.django_db


# --- the scripted provider's own check -------------------------------------------------------


def test_a_scripted_delay_longer_than_the_tool_timeout_is_refused():
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "TOOL_TIMEOUT_SECONDS": 2}):
        with pytest.raises(ProviderError, match="may not exceed the tool timeout"):
            validate_script([{"content": "slow", "delay": 3}])
        validate_script([{"content": "fine", "delay": 2}])


@pytest.mark.parametrize("delay", [math.inf, math.nan, -math.inf, -1, True, "1"])
def test_a_scripted_delay_that_is_not_a_finite_number_of_seconds_is_refused(delay):
    with pytest.raises(ProviderError, match="'delay' must be a finite, non-negative number"):
        validate_script([{"content": "x", "delay": delay}])


@pytest.mark.parametrize("error", [[], {"retryable": True}, ["fatal"]])
def test_a_scripted_error_that_is_not_a_string_is_refused_not_raised(error):
    with pytest.raises(ProviderError, match="'error' must be 'retryable' or 'fatal'"):
        validate_script([{"content": "x", "error": error}])


def test_an_unhashable_scripted_error_in_a_request_is_a_400(api):
    response = api.post(
        "/api/runs/",
        {"configuration": "hello", "prompt": "p", "script": [{"content": "x", "error": []}]},
        format="json",
    )

    assert response.status_code == 400, response.content[:300]
    assert "'error' must be 'retryable' or 'fatal'" in response.json()["message"]
    assert not AgentRun.objects.exists()


# --- the API ---------------------------------------------------------------------------------


@pytest.fixture
def api(db) -> APIClient:
    client = APIClient()
    client.force_authenticate(
        UserFactory(
            is_staff=True, permissions=["agentruns.decide_agentrun", "agentruns.start_agentrun"]
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


@pytest.mark.parametrize("mode", ["sync", "queued"])
@pytest.mark.parametrize(
    ("fragment", "where"),
    [
        ('"delay": 1e999', "$.script[0].delay is not a finite number (inf"),
        ('"delay": -1e999', "$.script[0].delay is not a finite number (-inf"),
        ('"usage": {"prompt_tokens": 1e999}', "$.script[0].usage.prompt_tokens"),
        ('"tool_calls": [{"name": "t", "arguments": {"n": 2e400}}]', "arguments.n is not a"),
    ],
)
def test_a_number_too_large_for_a_double_is_a_400_naming_where(api, mode, fragment, where):
    body = (
        f'{{"configuration": "hello", "prompt": "p", "mode": "{mode}", '
        f'"script": [{{"content": "x", {fragment}}}]}}'
    )

    response = api.post("/api/runs/", body, content_type="application/json")

    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == "parse_error"
    assert where in response.json()["message"]
    assert "1e999" in response.json()["message"]  # says why a number can be "not finite"
    assert not AgentRun.objects.exists()


def test_a_nan_in_a_body_is_a_400(api):
    body = '{"configuration": "hello", "prompt": "p", "script": [{"content": "x", "delay": NaN}]}'

    response = api.post("/api/runs/", body, content_type="application/json")

    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"
    assert not AgentRun.objects.exists()


@pytest.mark.parametrize("mode", ["sync", "queued"])
def test_a_script_the_provider_would_refuse_is_a_400_before_the_run_starts(api, mode):
    script = [{"content": "slow", "delay": 31}]

    response = api.post(
        "/api/runs/",
        {"configuration": "hello", "prompt": "p", "mode": mode, "script": script},
        format="json",
    )

    assert response.status_code == 400, response.content[:300]
    assert response.json()["code"] == "invalid_request"
    assert "may not exceed the tool timeout" in response.json()["message"]
    assert not AgentRun.objects.exists()


# --- the services, called from Python --------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "options", "problem"),
    [
        ("a\x00b", None, "prompt holds the NUL character"),
        ("p", {"system_prompt": "s\ud800"}, "system_prompt holds a lone surrogate"),
        ("p", {"script": [{"content": "x", "delay": math.inf}]}, "$[0].delay is not a finite"),
        ("p", {"script": [{"content": "x\x00"}]}, "$[0].content holds the NUL character"),
    ],
)
def test_a_request_that_cannot_be_stored_is_refused_before_anything_is_written(
    prompt, options, problem
):
    configuration = AgentConfigurationFactory()

    for start in (runs.run_start_sync, runs.run_enqueue):
        with pytest.raises(InvalidRequest, match=problem.replace("$", r"\$").replace("[", r"\[")):
            start(configuration=configuration, prompt=prompt, options=options)

    assert not AgentRun.objects.exists()


# --- configurations (the admin's form) -------------------------------------------------------


def admin_form(rf, **changes: str):
    request = rf.get("/")
    request.user = UserFactory(is_staff=True, is_superuser=True)
    form_class = admin.site._registry[AgentConfiguration].get_form(request)
    data = {
        "slug": "bounded",
        "name": "Bounded",
        "provider": "scripted",
        "timeout_seconds": "30",
        "tools": "[]",
        "max_iterations": "10",
        "on_approval_timeout": "deny",
        "script": '[{"content": "hi"}]',
        "is_active": "on",
        **changes,
    }
    return form_class(data=data)


def test_the_admin_form_accepts_bounded_values(rf):
    form = admin_form(
        rf,
        timeout_seconds="3600",
        approval_timeout=f"{MAX_APPROVAL_TIMEOUT.days} 00:00:00",
        price_per_million_prompt_tokens="999999.999999",
        daily_budget="99999999.999999",
        script='[{"content": "x", "delay": 30}]',
    )

    assert form.is_valid(), form.errors
    form.save()
    assert AgentConfiguration.objects.filter(slug="bounded").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("timeout_seconds", "0", "1 to 3600 seconds"),
        ("timeout_seconds", "3601", "1 to 3600 seconds"),
        ("timeout_seconds", "1e999", "whole number"),
        ("timeout_seconds", "99999999999999999999", "less than or equal to"),
        ("max_iterations", "1e999", "whole number"),
        ("max_iterations", "99999999", "1 to 32767"),
        ("max_iterations", "0", "1 to 32767"),
        ("approval_timeout", "367 00:00:00", "at most 366 days"),
        ("approval_timeout", "999999999 00:00:00", "at most 366 days"),
        ("approval_timeout", "9999999999 00:00:00", "number of days"),
        ("price_per_million_prompt_tokens", "Infinity", "Enter a number"),
        ("price_per_million_completion_tokens", "NaN", "Enter a number"),
        ("price_per_million_prompt_tokens", "1e999", "digits"),
        ("daily_budget", "-Infinity", "Enter a number"),
        ("script", '[{"content": "x", "delay": 1e999}]', "is not a finite number (inf"),
        ("script", '[{"content": "x", "delay": NaN}]', "is not a finite number (nan"),
        ("script", '[{"content": "a\\u0000"}]', "holds the NUL character"),
        ("script", '[{"content": "x", "delay": 31}]', "may not exceed the tool timeout"),
        ("tools", '["probe_\\ud800"]', "lone surrogate"),
    ],
)
def test_the_admin_form_refuses_a_value_out_of_bounds_with_a_form_error(rf, field, value, message):
    form = admin_form(rf, **{field: value})

    assert not form.is_valid()
    assert message in " ".join(form.errors[field]), form.errors
    assert not AgentConfiguration.objects.filter(slug="bounded").exists()


def test_a_deadline_written_around_the_admin_is_capped_at_the_bound():
    configuration = AgentConfigurationFactory.build(approval_timeout=timedelta(days=10**6))

    assert WaitDeadline.of(configuration).timeout == MAX_APPROVAL_TIMEOUT


# --- the playground ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1e999", "NaN", "-1", "0", "99999999999999999999", "2.5"])
def test_the_playground_refuses_a_round_cap_out_of_bounds(value):
    configuration = AgentConfigurationFactory()

    form = RunForm(
        data={"configuration": configuration.slug, "prompt": "p", "max_iterations": value}
    )

    assert not form.is_valid()
    assert "max_iterations" in form.errors
