"""``agentruns.conf``: the defaults live in the app; a setting and the environment override; the
code reads one typed, frozen, cached ``AgentrunsSettings`` that follows ``setting_changed``."""

from __future__ import annotations

import dataclasses
import threading
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from agentruns import conf
from agentruns.conf import AgentrunsSettings, app_settings


def test_every_name_has_a_default_a_parser_and_a_typed_field() -> None:
    fields = {field.name for field in dataclasses.fields(AgentrunsSettings)}
    assert set(conf.DEFAULTS) == set(conf.PARSERS)
    assert {name.lower() for name in conf.DEFAULTS} == fields


def test_without_an_agentruns_setting_every_name_has_its_default(settings) -> None:
    del settings.AGENTRUNS
    read = app_settings()
    assert read.lease_seconds == conf.DEFAULTS["LEASE_SECONDS"]
    assert read.max_requeues == conf.DEFAULTS["MAX_REQUEUES"]
    assert read.webhook_allowlist == ()
    assert read.secret_env_prefixes == ("LEASEHOLD_",)
    assert read.user_daily_budget is None
    assert read.cost_currency == "USD"
    expected = {
        name.lower(): tuple(default) if isinstance(default, list) else default
        for name, default in conf.DEFAULTS.items()
    }
    assert dataclasses.asdict(read) == {**expected, "user_daily_budget": None}


def test_the_settings_are_frozen_and_typed() -> None:
    read = app_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.lease_seconds = 1  # type: ignore[misc]
    assert isinstance(read.lease_seconds, float) and isinstance(read.max_requeues, int)


def test_a_partial_setting_overrides_only_its_own_names() -> None:
    with override_settings(AGENTRUNS={"LEASE_SECONDS": 7, "USER_DAILY_BUDGET": " 2.50 "}):
        assert app_settings().lease_seconds == 7
        assert app_settings().max_requeues == conf.DEFAULTS["MAX_REQUEUES"]
        assert app_settings().user_daily_budget == Decimal("2.50")


def test_the_settings_are_read_once_and_refreshed_when_the_setting_changes(settings) -> None:
    first = app_settings()
    assert app_settings() is first  # cached: no parsing on a hot path
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MAX_REQUEUES": 9}):
        assert app_settings().max_requeues == 9
    assert app_settings().max_requeues == conf.DEFAULTS["MAX_REQUEUES"]
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": ["hooks.example"]}
    assert app_settings().webhook_allowlist == ("hooks.example",)


def test_a_setting_replaced_without_the_signal_is_read_again(monkeypatch) -> None:
    from django.conf import settings

    assert app_settings().max_requeues == conf.DEFAULTS["MAX_REQUEUES"]
    monkeypatch.setattr(settings, "AGENTRUNS", {**settings.AGENTRUNS, "MAX_REQUEUES": 5})
    assert app_settings().max_requeues == 5


def test_a_changed_setting_is_never_hidden_by_a_read_that_was_in_flight(settings) -> None:
    """A read that began before ``setting_changed`` must not cache the old value after it."""
    started, release = threading.Event(), threading.Event()
    real_read = conf.read

    def slow_read(configured: object):  # type: ignore[no-untyped-def]
        built = real_read(configured)
        started.set()
        release.wait(5)
        return built

    conf.reset()
    conf.read = slow_read  # type: ignore[assignment]
    try:
        reader = threading.Thread(target=app_settings)
        reader.start()
        assert started.wait(5)
        conf.read = real_read
        settings.AGENTRUNS = {**settings.AGENTRUNS, "MAX_REQUEUES": 8}
        release.set()
        reader.join(5)
    finally:
        conf.read = real_read
    assert app_settings().max_requeues == 8


def test_a_bad_value_is_refused_when_read_naming_the_setting_and_the_check() -> None:
    with override_settings(AGENTRUNS={"LEASE_SECONDS": "soon"}):
        with pytest.raises(ImproperlyConfigured, match=r"AGENTRUNS_LEASE_SECONDS.*agentruns\.E002"):
            app_settings()
        with pytest.raises(ImproperlyConfigured):  # nothing cached: refused at every read
            app_settings()
    assert app_settings().lease_seconds == conf.DEFAULTS["LEASE_SECONDS"]


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


def test_a_bad_environment_value_never_fails_the_import_it_is_refused_when_read() -> None:
    built = conf.settings_from_env(
        {"AGENTRUNS_MAX_REQUEUES": "three", "AGENTRUNS_LEASE_SECONDS": "0.5"}
    )
    assert built["MAX_REQUEUES"] == "three"  # kept as text for the check to name
    refused = pytest.raises(ImproperlyConfigured, match="AGENTRUNS_MAX_REQUEUES='three'")
    with override_settings(AGENTRUNS=built), refused:
        app_settings()
    with override_settings(AGENTRUNS={**built, "MAX_REQUEUES": 2}):
        assert app_settings().lease_seconds == 0.5  # seconds may be fractions


def test_the_defaults_are_not_shared_with_a_built_setting() -> None:
    built = conf.settings_from_env({})
    assert built == conf.DEFAULTS
    built["WEBHOOK_ALLOWLIST"].append("x")  # a shallow copy would leak this into DEFAULTS
    assert conf.DEFAULTS["WEBHOOK_ALLOWLIST"] == []
