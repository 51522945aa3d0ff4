"""``agentruns.system_checks``: ``manage.py check`` reports every bad ``AGENTRUNS`` value with a
stable id, is silent for the defaults, and the same values are refused by ``app_settings()``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from agentruns.conf import app_settings
from agentruns.system_checks import check_agentruns_settings

ROOT = Path(__file__).resolve().parents[2]


def agentruns(**values: Any) -> override_settings:
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, **values})


def ids() -> list[str]:
    return [message.id for message in check_agentruns_settings() if message.id]


def test_the_defaults_are_silent() -> None:
    assert list(check_agentruns_settings()) == []
    assert [m for m in run_checks() if (m.id or "").startswith("agentruns.")] == []


def test_no_setting_at_all_is_silent(settings) -> None:
    del settings.AGENTRUNS
    assert list(check_agentruns_settings()) == []


def test_the_check_runs_only_for_this_app() -> None:
    from django.apps import apps

    with agentruns(LEASE_SECONDS=-1):
        assert check_agentruns_settings(app_configs=[apps.get_app_config("auth")]) == []
        assert ids() == ["agentruns.E003"]


def test_e001_a_setting_that_is_not_a_dict() -> None:
    with override_settings(AGENTRUNS=["LEASE_SECONDS", 60]):
        assert ids() == ["agentruns.E001"]
        with pytest.raises(ImproperlyConfigured, match="AGENTRUNS must be a dict"):
            app_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", "a minute"),
        ("LEASE_SECONDS", float("nan")),
        ("MAX_REQUEUES", "three"),
        ("MAX_REQUEUES", 2.5),
        ("MAX_ITERATIONS", True),
        ("TOOL_TIMEOUT_SECONDS", None),
        ("MCP_STDIO_ALLOWED", "maybe"),
        ("NOTIFY_EMAIL", 1),
        ("WEBHOOK_ALLOWLIST", {"hooks.example": True}),
        ("WEBHOOK_ALLOWLIST", ["hooks.example", 8080]),
        ("SECRET_ENV_PREFIXES", None),
        ("METRICS_TOKEN", 1234),
        ("USER_DAILY_BUDGET", "ten"),
        ("USER_DAILY_BUDGET", True),
    ],
)
def test_e002_a_value_that_does_not_parse_as_its_type(name: str, value: Any) -> None:
    with agentruns(**{name: value}):
        assert ids() == ["agentruns.E002"]
        with pytest.raises(ImproperlyConfigured, match=f"AGENTRUNS_{name}"):
            app_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", 0),
        ("LEASE_SECONDS", -1),
        ("TOOL_TIMEOUT_SECONDS", 0),
        ("PREVIEW_TIMEOUT_SECONDS", -0.5),
        ("REDISPATCH_SECONDS", 0),
        ("NOTIFY_WEBHOOK_TIMEOUT_SECONDS", 0),
        ("STOP_GRACE_SECONDS", -1),
        ("RETRY_BACKOFF_SECONDS", -2),
        ("MAX_REQUEUES", -1),
        ("MAX_ITERATIONS", 0),
        ("MAX_PROMPT_CHARS", 0),
        ("MAX_ARGUMENT_CHARS", "0"),
        ("RECONCILE_CHECKS", -1),
        ("REAPER_INTERVAL_MINUTES", 0),
        ("RETENTION_DAYS", -30),
        ("NOTIFY_INTERVAL", -300),
        ("COST_CURRENCY", "  "),
        ("SITE_URL", "leasehold.example"),
        ("SITE_URL", "ftp://leasehold.example"),
        ("USER_DAILY_BUDGET", "-1"),
        ("USER_DAILY_BUDGET", "Infinity"),
    ],
)
def test_e003_a_value_out_of_its_range(name: str, value: Any) -> None:
    with agentruns(**{name: value}):
        assert ids() == ["agentruns.E003"]
        with pytest.raises(ImproperlyConfigured, match=f"AGENTRUNS_{name}"):
            app_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STOP_GRACE_SECONDS", 0),
        ("RETRY_BACKOFF_SECONDS", 0),
        ("MAX_REQUEUES", 0),
        ("RECONCILE_CHECKS", 0),
        ("RETENTION_DAYS", 0),
        ("NOTIFY_INTERVAL", 0),
        ("LEASE_SECONDS", 0.45),
        ("LEASE_SECONDS", "90"),
        ("NOTIFY_EMAIL", "off"),
        ("SITE_URL", "https://leasehold.example/"),
        ("USER_DAILY_BUDGET", "0"),
        ("USER_DAILY_BUDGET", None),
        ("SECRET_ENV_PREFIXES", []),
        ("SECRET_ENV_PREFIXES", ""),
        ("SECRET_ENV_PREFIXES", "ACME_,TEAM_"),
    ],
)
def test_the_edges_of_each_range_are_allowed(name: str, value: Any) -> None:
    with agentruns(**{name: value}):
        assert ids() == []
        app_settings()


@pytest.mark.parametrize(
    "entry",
    [
        "https://hooks.example",
        "hooks.example/path",
        "user@hooks.example",
        "*.hooks.example",
        "hooks example",
        "hooks.example:0",
        "hooks.example:65536",
        "hooks.example:http",
        "[hooks.example]:443",
        "[127.0.0.1]:80",
        "fe80::1:nope",
        "-hooks.example",
    ],
)
def test_e004_an_allowlist_entry_that_is_not_a_host(entry: str) -> None:
    with agentruns(WEBHOOK_ALLOWLIST=["ok.example", entry]):
        assert ids() == ["agentruns.E004"]
        with pytest.raises(ImproperlyConfigured, match="WEBHOOK_ALLOWLIST"):
            app_settings()


def test_the_allowlist_accepts_every_form_outbound_lists() -> None:
    entries = [
        "hooks.example",
        "Hooks.Example:8443",
        "127.0.0.1",
        "127.0.0.1:8000",
        "::1",
        "[::1]",
        "[::1]:8080",
        "localhost:8000",
        "under_score.example",
    ]
    with agentruns(WEBHOOK_ALLOWLIST=entries):
        assert ids() == []
        assert app_settings().webhook_allowlist == tuple(entries)
    with agentruns(WEBHOOK_ALLOWLIST="a.example, b.example:8080,"):
        assert app_settings().webhook_allowlist == ("a.example", "b.example:8080")


@pytest.mark.parametrize("prefix", ["LEASE-HOLD_", "1PASSWORD_", "ACME_ KEY", "*"])
def test_e005_a_secret_prefix_no_variable_name_can_start_with(prefix: str) -> None:
    with agentruns(SECRET_ENV_PREFIXES=["LEASEHOLD_", prefix]):
        assert ids() == ["agentruns.E005"]
        with pytest.raises(ImproperlyConfigured, match="SECRET_ENV_PREFIXES"):
            app_settings()


def test_a_message_never_shows_the_metrics_token_and_cuts_a_long_value() -> None:
    with agentruns(METRICS_TOKEN=987654321, WEBHOOK_ALLOWLIST={"x" * 5000: 1}):
        messages = [m.msg for m in check_agentruns_settings()]
        assert len(messages) == 2 and "987654321" not in " ".join(messages)
        assert all(len(message) < 300 for message in messages)
        with pytest.raises(ImproperlyConfigured) as refused:
            app_settings()
        assert "987654321" not in str(refused.value)


def test_w001_an_unknown_name_is_likely_a_typo() -> None:
    with agentruns(LEASE_SECOND=90):
        [message] = check_agentruns_settings()
        assert message.id == "agentruns.W001"
        assert "LEASE_SECOND" in message.msg and "LEASE_SECONDS" in message.hint
        # Only a warning: the name is ignored and everything else is read as usual.
        assert app_settings().lease_seconds == 60


@pytest.mark.parametrize("value", [["LEASEHOLD_", ""], [" "], "LEASEHOLD_,,ACME_", [""]])
def test_w002_an_empty_secret_prefix_is_ignored_never_a_wildcard(value: Any) -> None:
    with agentruns(SECRET_ENV_PREFIXES=value):
        assert ids() == ["agentruns.W002"]
        assert "" not in app_settings().secret_env_prefixes
        assert all(prefix.strip() for prefix in app_settings().secret_env_prefixes)


def test_w003_a_tool_timeout_a_worker_task_cannot_outlast() -> None:
    cluster = {**settings.Q_CLUSTER, "timeout": 30}
    with override_settings(Q_CLUSTER=cluster), agentruns(TOOL_TIMEOUT_SECONDS=30):
        assert ids() == ["agentruns.W003"]
    with override_settings(Q_CLUSTER=cluster), agentruns(TOOL_TIMEOUT_SECONDS=29):
        assert ids() == []


def test_every_bad_value_is_reported_at_once() -> None:
    with agentruns(LEASE_SECONDS=0, MAX_REQUEUES="x", WEBHOOK_ALLOWLIST=["a b"], TYPO=1):
        assert sorted(ids()) == [
            "agentruns.E002",
            "agentruns.E003",
            "agentruns.E004",
            "agentruns.W001",
        ]


def test_manage_py_check_reports_the_ids_and_fails_on_an_error() -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "AGENTRUNS_MAX_REQUEUES": "three",
        "AGENTRUNS_WEBHOOK_ALLOWLIST": "https://hooks.example",
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "agentruns.E002" in done.stderr and "AGENTRUNS_MAX_REQUEUES='three'" in done.stderr
    assert "agentruns.E004" in done.stderr
    assert "Traceback" not in done.stderr  # reported, not crashed
    clean = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={k: v for k, v in env.items() if not k.startswith("AGENTRUNS_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert clean.returncode == 0, clean.stderr
    assert "agentruns." not in clean.stdout + clean.stderr
