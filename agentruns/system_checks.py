"""Django system checks for the ``AGENTRUNS`` settings (``manage.py check``, and every command
that runs checks: ``runserver``, ``migrate``, ``qcluster``…).

Each problem ``agentruns.conf.read`` finds is one message with a stable id — ``agentruns.E…`` a
value ``app_settings()`` refuses, ``agentruns.W…`` one it lets through (README "Checking the
settings") — plus one check across settings that are not Leasehold's own (``W003``: a tool
call may outlast django-q2's task timeout). Reads settings only: never the database.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.exceptions import ImproperlyConfigured

from agentruns import conf, ledger

OBJ = "settings.AGENTRUNS"
TIMEOUT_ABOVE_TASK = "W003"  # a tool or preview timeout not below Q_CLUSTER["timeout"]


def _message(problem: conf.Problem) -> CheckMessage:
    kind = Error if problem.is_error else Warning
    return kind(problem.message, hint=problem.hint or None, obj=OBJ, id=f"agentruns.{problem.id}")


def _task_timeout_warnings(read: conf.AgentrunsSettings) -> list[CheckMessage]:
    """A single tool call (or preview) at least as long as django-q2's task ``timeout`` gets its
    worker killed mid-call: the segment dies and the run waits for its lease to expire."""
    cluster = getattr(settings, "Q_CLUSTER", None)
    timeout = cluster.get("timeout") if isinstance(cluster, dict) else None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        return []
    found: list[CheckMessage] = []
    for name in ("TOOL_TIMEOUT_SECONDS", "PREVIEW_TIMEOUT_SECONDS"):
        seconds = getattr(read, name.lower())
        if seconds >= timeout:
            found.append(
                Warning(
                    f"AGENTRUNS_{name}={seconds:g} is not below Q_CLUSTER['timeout']={timeout:g}: "
                    "django-q2 kills a worker whose task runs that long, in the middle of the call",
                    hint="raise Q_CLUSTER['timeout'] (Q_TIMEOUT) well above the longest segment",
                    obj=OBJ,
                    id=f"agentruns.{TIMEOUT_ABOVE_TASK}",
                )
            )
    return found


@register()
def check_agentruns_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> Iterable[CheckMessage]:
    """Every problem of the ``AGENTRUNS`` setting (none for the defaults)."""
    if app_configs is not None and not any(c.name == "agentruns" for c in app_configs):
        return []
    read, problems = conf.read(getattr(settings, "AGENTRUNS", None))
    messages = [_message(problem) for problem in problems]
    if read is not None:
        messages += _task_timeout_warnings(read)
    return messages


@register()
def check_ledger_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``agentruns.E010``: ``AGENTRUNS_LEDGER_KEY`` is set but its key cannot be read (a name
    the secret rule refuses, an unset variable, a key shorter than 32 characters): every event
    write would be refused."""
    try:
        problem = ledger.key_problem()
    except ImproperlyConfigured:
        return []  # the AGENTRUNS setting itself is bad: check_agentruns_settings reports it
    if problem is None:
        return []
    return [
        Error(
            f"The ledger's key cannot be used: {problem}.",
            hint="Set AGENTRUNS_LEDGER_KEY to the name of a LEASEHOLD_-prefixed environment "
            "variable holding a key of at least 32 characters, or leave it empty (unkeyed).",
            id="agentruns.E010",
        )
    ]


@register()
def check_slack(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Slack interactivity (``agentruns.chat``), when ``LEASEHOLD_SLACK_SIGNING_SECRET`` is set:
    ``agentruns.E020`` its name is refused by ``SECRET_ENV_PREFIXES`` (the endpoint stays off);
    ``agentruns.W020`` ``SITE_URL`` is empty, so messages carry no *Open* button and their
    links are paths. Reads the environment and settings only."""
    from agentruns.chat.slack_requests import SIGNING_SECRET_ENV
    from agentruns.secrets import secret_env_problem

    if not os.environ.get(SIGNING_SECRET_ENV):
        return []
    try:
        read = conf.app_settings()
        problem = secret_env_problem(SIGNING_SECRET_ENV)
    except ImproperlyConfigured:
        return []  # check_agentruns_settings reports it
    if problem is not None:
        return [
            Error(
                f"Slack interactivity is off: {problem}.",
                hint="Add LEASEHOLD_ to AGENTRUNS['SECRET_ENV_PREFIXES'], or unset the variable.",
                id="agentruns.E020",
            )
        ]
    if not read.site_url:
        return [
            Warning(
                "AGENTRUNS_SITE_URL is empty: Slack messages get no Open button (Slack refuses "
                "a relative link) and their review links are paths.",
                hint="Set AGENTRUNS_SITE_URL to the site's base URL, e.g. https://leasehold.example",
                obj=OBJ,
                id="agentruns.W020",
            )
        ]
    return []
