"""``agentruns.conf``: the defaults live in the app; a setting and the environment override."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from agentruns import conf


def test_without_an_agentruns_setting_every_name_has_its_default(settings) -> None:
    del settings.AGENTRUNS
    for name, default in conf.DEFAULTS.items():
        assert conf.get(name) == default


def test_a_partial_setting_overrides_only_its_own_names() -> None:
    with override_settings(AGENTRUNS={"LEASE_SECONDS": 7}):
        assert conf.get("LEASE_SECONDS") == 7
        assert conf.get("MAX_REQUEUES") == conf.DEFAULTS["MAX_REQUEUES"]


def test_an_unknown_name_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured):
        conf.get("NO_SUCH_SETTING")


def test_the_environment_overrides_each_default_by_its_type() -> None:
    built = conf.settings_from_env(
        {
            "AGENTRUNS_LEASE_SECONDS": "9",
            "AGENTRUNS_MCP_STDIO_ALLOWED": "yes",
            "AGENTRUNS_WEBHOOK_ALLOWLIST": "a.example, b.example:8080,",
            "UNRELATED": "x",
        }
    )
    assert set(built) == set(conf.DEFAULTS)
    assert built["LEASE_SECONDS"] == 9
    assert built["MCP_STDIO_ALLOWED"] is True
    assert built["WEBHOOK_ALLOWLIST"] == ["a.example", "b.example:8080"]
    assert built["MAX_REQUEUES"] == conf.DEFAULTS["MAX_REQUEUES"]
    with pytest.raises(ImproperlyConfigured):
        conf.settings_from_env({"AGENTRUNS_MAX_REQUEUES": "three"})


def test_the_defaults_are_not_shared_with_a_built_setting() -> None:
    built = conf.settings_from_env({})
    assert built == conf.DEFAULTS
    built["WEBHOOK_ALLOWLIST"].append("x")  # a shallow copy would leak this into DEFAULTS
    assert conf.DEFAULTS["WEBHOOK_ALLOWLIST"] == []
