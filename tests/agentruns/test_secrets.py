"""Secrets by name (``agentruns.secrets``, docs/design.md §12.4): only allowed environment
variable names may be named, refused when a row is validated (admin forms included); the refusal
at use, with nothing sent, is tested with the provider and the MCP client."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import override_settings

from agentruns import conf
from agentruns.exceptions import LeaseholdError, SecretEnvRefused
from agentruns.models import AgentConfiguration, McpServer
from agentruns.secrets import check_secret_env, read_secret_env, secret_env_problem
from tests.agentruns.factories import UserFactory


def prefixes(value: Any):
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "SECRET_ENV_PREFIXES": value})


@pytest.mark.parametrize("name", ["LEASEHOLD_OPENAI_API_KEY", "LEASEHOLD_X", "LEASEHOLD_"])
def test_names_with_the_default_prefix_are_allowed(name: str) -> None:
    assert secret_env_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "DJANGO_SECRET_KEY",
        "DATABASE_URL",
        "OPENAI_API_KEY",
        "leasehold_lowercase",
        "XLEASEHOLD_Y",
        "LEASEHOLD-DASH",
        "LEASEHOLD_ X",
        "",
        None,
        3,
    ],
)
def test_every_other_name_is_refused(name: Any) -> None:
    assert secret_env_problem(name) is not None
    with pytest.raises(SecretEnvRefused):
        check_secret_env(name, what="api_key_env")


def test_the_refusal_is_typed_with_a_stable_code_and_names_the_rule() -> None:
    with pytest.raises(SecretEnvRefused) as refused:
        check_secret_env("DJANGO_SECRET_KEY", what="api_key_env")
    assert isinstance(refused.value, LeaseholdError)
    assert refused.value.as_dict() == {
        "code": "secret_env_refused",
        "message": "api_key_env: DJANGO_SECRET_KEY may not hold a secret: only variables whose "
        "names start with LEASEHOLD_ may (AGENTRUNS['SECRET_ENV_PREFIXES'])",
        "variable": "DJANGO_SECRET_KEY",
    }


def test_a_refused_name_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-real-secret")
    monkeypatch.setenv("LEASEHOLD_KEY", "allowed")
    assert read_secret_env("LEASEHOLD_KEY", what="x") == "allowed"
    assert read_secret_env("LEASEHOLD_UNSET_FOR_SURE", what="x") is None
    with pytest.raises(SecretEnvRefused) as refused:
        read_secret_env("DJANGO_SECRET_KEY", what="x")
    assert "the-real-secret" not in str(refused.value.as_dict())


def test_the_prefixes_are_a_setting_and_an_environment_variable() -> None:
    assert conf.DEFAULTS["SECRET_ENV_PREFIXES"] == ["LEASEHOLD_"]
    parsed = conf.settings_from_env({"AGENTRUNS_SECRET_ENV_PREFIXES": "ACME_, LEASEHOLD_,"})
    assert parsed["SECRET_ENV_PREFIXES"] == ["ACME_", "LEASEHOLD_"]
    with prefixes(["ACME_", "TEAM_"]):
        assert secret_env_problem("ACME_KEY") is None
        assert secret_env_problem("TEAM_KEY") is None
        assert "ACME_ or TEAM_" in str(secret_env_problem("LEASEHOLD_KEY"))
    with prefixes("ACME_,TEAM_"):  # a project may write one comma-separated string
        assert secret_env_problem("TEAM_KEY") is None
    for nothing in ([], [""], ""):  # an empty prefix is ignored, never a wildcard
        with prefixes(nothing):
            assert "SECRET_ENV_PREFIXES'] is empty" in str(secret_env_problem("LEASEHOLD_KEY"))


# --- Model validation and the admin's forms ----------------------------------------------------


@pytest.mark.django_db
def test_a_configuration_may_name_only_an_allowed_variable() -> None:
    fields = {"slug": "o", "name": "O", "provider": "openai", "model": "m"}
    AgentConfiguration(**fields, api_key_env="LEASEHOLD_OPENAI_API_KEY").full_clean()
    AgentConfiguration(**fields, api_key_env="").full_clean()  # blank: no key (refused at use)
    with pytest.raises(ValidationError) as refused:
        AgentConfiguration(**fields, api_key_env="DJANGO_SECRET_KEY").full_clean()
    assert "DJANGO_SECRET_KEY may not hold a secret" in refused.value.message_dict["api_key_env"][0]


@pytest.mark.django_db
def test_an_mcp_server_may_name_only_allowed_variables() -> None:
    url = "http://127.0.0.1:9/mcp"
    McpServer(name="tix", url=url, headers_env={"Authorization": "LEASEHOLD_TIX"}).full_clean()
    with pytest.raises(ValidationError) as refused:
        McpServer(
            name="tix",
            url=url,
            headers_env={"Authorization": "LEASEHOLD_TIX", "X-Key": "DJANGO_SECRET_KEY"},
        ).full_clean()
    [message] = refused.value.message_dict["headers_env"]
    assert message.startswith("X-Key: DJANGO_SECRET_KEY may not hold a secret")


@pytest.mark.django_db
def test_the_admin_forms_show_the_refusal_and_save_nothing(client: Any) -> None:
    client.force_login(UserFactory(is_superuser=True))
    configuration = client.post(
        "/admin/agentruns/agentconfiguration/add/",
        {
            "slug": "leaky",
            "name": "Leaky",
            "provider": "openai",
            "model": "m",
            "base_url": "http://attacker.example/v1",
            "api_key_env": "DJANGO_SECRET_KEY",
            "timeout_seconds": 30,
            "tools": "[]",
            "max_iterations": 10,
            "script": "[]",
            "is_active": "on",
        },
    )
    assert configuration.status_code == 200
    assert "DJANGO_SECRET_KEY may not hold a secret" in configuration.content.decode()
    assert not AgentConfiguration.objects.filter(slug="leaky").exists()

    server = client.post(
        "/admin/agentruns/mcpserver/add/",
        {
            "name": "leaky",
            "transport": "streamable_http",
            "url": "http://attacker.example/mcp",
            "enabled": "on",
            "requires_approval": "true",
            "timeout_seconds": 20,
            "allowed_tools": "[]",
            "headers_env": '{"Authorization": "DJANGO_SECRET_KEY"}',
            "tools_snapshot": "[]",
        },
    )
    assert server.status_code == 200
    assert "DJANGO_SECRET_KEY may not hold a secret" in server.content.decode()
    assert not McpServer.objects.filter(name="leaky").exists()
