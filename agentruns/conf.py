"""The ``AGENTRUNS`` settings: the documented defaults, a project's overrides, the environment.

Every name has its default here, so a project that defines no ``AGENTRUNS`` setting at all gets
them. A project that wants the ``AGENTRUNS_<NAME>`` environment overrides builds its setting with
``settings_from_env(os.environ)`` (``config.settings.base`` does). ``get`` reads the project's
value first and falls back to the default, per name.

Must not import Django models or the host project: settings modules import this one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DEFAULTS: dict[str, Any] = {
    # Seconds a segment's lease lasts; renewed at every step boundary and every third of it.
    "LEASE_SECONDS": 60,
    # Retries a run may use (failure retries and stale reclaims share the budget).
    "MAX_REQUEUES": 3,
    # Hard upper bound on a configuration's max_iterations.
    "MAX_ITERATIONS": 20,
    # Timeout of one tool call; keep it below what the heartbeat ticker can cover.
    "TOOL_TIMEOUT_SECONDS": 30,
    # Longest prompt a run accepts (characters); longer ones are refused before anything runs.
    "MAX_PROMPT_CHARS": 200_000,
    # Time a tool's preview may take when a turn suspends for approval (or is re-checked).
    "PREVIEW_TIMEOUT_SECONDS": 5,
    # Queued runs nobody claimed for this long get a fresh task from the reaper.
    "REDISPATCH_SECONDS": 120,
    # First retry delay; doubled on every retry (exponential backoff).
    "RETRY_BACKOFF_SECONDS": 2,
    # How many times in all a tool's automatic check asks whether an in-doubt write landed when
    # it cannot tell (unknown, an error, a timeout): retried with the RETRY_BACKOFF_SECONDS
    # backoff, then left to a person. 0 switches checks off.
    "RECONCILE_CHECKS": 3,
    # Hosts (or host:port) call_webhook may POST to. Anything else is refused unsent.
    "WEBHOOK_ALLOWLIST": [],
    # Whether MCP servers may be started as local processes (stdio transport).
    "MCP_STDIO_ALLOWED": False,
    # The prefixes an environment variable's name must start with for a configuration
    # (api_key_env) or an MCP server (headers_env) to read a secret from it; anything else
    # (DJANGO_SECRET_KEY, DATABASE_URL…) is refused when saved and when read. Case-sensitive;
    # empty entries are ignored, so an empty list allows no secret at all.
    "SECRET_ENV_PREFIXES": ["LEASEHOLD_"],
    # How often (minutes) django-q2 runs the stale-run reaper.
    "REAPER_INTERVAL_MINUTES": 1,
    # Days to keep finished runs: when above 0, setup_schedules creates a daily purge of the
    # completed, failed and cancelled runs that finished longer ago. 0 (default): keep them all.
    "RETENTION_DAYS": 0,
    # A bearer token that may read /metrics (a scraper); empty: only staff sessions may.
    "METRICS_TOKEN": "",
    # Notifications (README "Notifications"): the shortest time between two digests to one
    # person (or to one configuration's webhook), in seconds. 0 switches notifications off
    # (setup_schedules then removes their schedule).
    "NOTIFY_INTERVAL": 300,
    # Whether the people who may decide a waiting run get an email digest (the webhook of a
    # configuration is switched by its own notify_webhook_url).
    "NOTIFY_EMAIL": True,
    # How long a notification webhook may take to answer.
    "NOTIFY_WEBHOOK_TIMEOUT_SECONDS": 5,
    # The site's base URL for absolute links in notifications (e.g. https://leasehold.example);
    # empty: the links are paths only.
    "SITE_URL": "",
    # The currency configurations' prices and budgets are in (a name shown beside every cost).
    "COST_CURRENCY": "USD",
    # Most each initiator's runs may spend per UTC day, all configurations together (a decimal,
    # in COST_CURRENCY); empty: no per-user budget. Read by agentruns.budgets.
    "USER_DAILY_BUDGET": "",
    # PostgreSQL (psycopg 3): prepare the step boundary's statements on the server, once per
    # connection, and execute them by name. Off: a transaction-mode pooler hands each transaction
    # any server connection, where a name may be unknown, taken, or another client's statement.
    # Turn it on only where every statement of a connection meets the server session that
    # prepared it: PostgreSQL directly, a session-mode pooler, or PgBouncer >= 1.21 with
    # max_prepared_statements > 0. Django's own queries are never prepared either way.
    "PREPARED_STATEMENTS": False,
}


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            lowered = raw.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, list | tuple):
            return [item.strip() for item in raw.split(",") if item.strip()]
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"AGENTRUNS_{name}={raw!r} is not a valid {type(default).__name__}"
        ) from exc
    return raw


def parse_env_overrides(defaults: Mapping[str, Any], environ: Mapping[str, str]) -> dict:
    """A copy of the defaults (lists not shared) with every ``AGENTRUNS_<NAME>`` applied."""
    result = copy.deepcopy(dict(defaults))
    for name, default in defaults.items():
        raw = environ.get(f"AGENTRUNS_{name}")
        if raw is not None:
            result[name] = _parse(name, raw, default)
    return result


def settings_from_env(environ: Mapping[str, str]) -> dict:
    """A complete ``AGENTRUNS`` setting: ``DEFAULTS`` with the environment's overrides applied.

    Raises ``ImproperlyConfigured`` for a value that does not parse as its default's type, or a
    ``USER_DAILY_BUDGET`` that is neither empty nor a decimal of 0 or more.
    """
    parsed = parse_env_overrides(DEFAULTS, environ)
    budget = str(parsed["USER_DAILY_BUDGET"]).strip()
    if budget:
        try:
            valid = Decimal(budget).is_finite() and Decimal(budget) >= 0
        except InvalidOperation:
            valid = False
        if not valid:
            raise ImproperlyConfigured(
                f"AGENTRUNS_USER_DAILY_BUDGET={budget!r} is not a decimal of 0 or more"
            )
    return parsed


def get(name: str) -> Any:
    """One ``AGENTRUNS`` value, read at call time so ``override_settings`` works in tests.

    The project's ``AGENTRUNS[name]`` when it has one (the setting may be absent or partial),
    else the default. Raises ``ImproperlyConfigured`` for a name that has no default.
    """
    # ``settings`` keeps a value it served until a setting changes (``LazySettings``): after the
    # first read this is a dictionary lookup, with no cache here to go stale.
    configured = getattr(settings, "AGENTRUNS", None) or {}
    if name in configured:
        return configured[name]
    if name in DEFAULTS:
        return DEFAULTS[name]
    raise ImproperlyConfigured(f"Unknown AGENTRUNS setting {name!r}")
