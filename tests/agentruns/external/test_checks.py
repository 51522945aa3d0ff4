"""The external surface's system checks."""

from __future__ import annotations

from importlib import metadata

from agentruns.external import checks


def ids(found) -> list[str]:
    return [message.id for message in found]


def test_the_installed_packages_and_defaults_pass():
    assert checks.check_external() == []


def test_a_state_limit_above_16_mib_is_an_error(settings):
    settings.AGENTRUNS = {"EXTERNAL_STATE_MAX_BYTES": 17 * 1024 * 1024}
    assert ids(checks.check_external()) == ["agentruns.E070"]


def test_a_langgraph_outside_the_supported_series_is_an_error(monkeypatch):
    versions = {"langgraph": "0.6.3", "langchain-core": "1.8.0"}
    monkeypatch.setattr(checks, "_version", versions.get)
    assert ids(checks.check_external()) == ["agentruns.E071"]


def test_half_of_the_extra_is_an_error(monkeypatch):
    monkeypatch.setattr(checks, "_version", {"langchain-core": "1.8.0"}.get)
    assert ids(checks.check_external()) == ["agentruns.E072"]
    monkeypatch.setattr(checks, "_version", {}.get)
    assert checks.check_external() == []
    assert metadata.version("langgraph").startswith(checks.LANGGRAPH_SERIES)
