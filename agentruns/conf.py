"""The ``AGENTRUNS`` settings: the documented defaults, a project's overrides, the environment,
read into one typed, frozen ``AgentrunsSettings``.

Every name has its default here, so a project that defines no ``AGENTRUNS`` setting at all gets
them. A project that wants the ``AGENTRUNS_<NAME>`` environment overrides builds its setting with
``settings_from_env(os.environ)`` (``config.settings.base`` does). ``app_settings()`` is the one
way the code reads them: the project's value per name over the default, each parsed and checked
once, cached until Django's ``setting_changed`` (``override_settings``) says ``AGENTRUNS``
changed. A bad value never fails an import: ``manage.py check`` reports it
(``agentruns.system_checks``, the ids of ``Problem``), and ``app_settings()`` refuses it with
``ImproperlyConfigured`` naming the setting.

Must not import Django models or the host project: settings modules import this one.
"""

from __future__ import annotations

import copy
import difflib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from agentruns.conf_values import (
    EMPTY_SECRET_PREFIX,
    FALSE_WORDS,
    NOT_A_DICT,
    TRUE_WORDS,
    UNKNOWN_NAME,
    Invalid,
    Parser,
    Problem,
    parse_allowlist,
    parse_boolean,
    parse_budget,
    parse_currency,
    parse_integer,
    parse_prefixes,
    parse_seconds,
    parse_site_url,
    parse_text,
    shown,
)

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
    # Largest tool arguments (or human input values) checked against a schema, in characters of
    # JSON; larger ones are refused unchecked (the model or the person is told), so a check's
    # time stays bounded.
    "MAX_ARGUMENT_CHARS": 131_072,
    # Time a tool's preview may take when a turn suspends for approval (or is re-checked).
    "PREVIEW_TIMEOUT_SECONDS": 5,
    # Queued runs nobody claimed for this long get a fresh task from the reaper.
    "REDISPATCH_SECONDS": 120,
    # A worker whose cluster is told to stop (SIGTERM) lets a read tool in flight run this long
    # before interrupting it and handing the run back; writes and model calls always finish.
    "STOP_GRACE_SECONDS": 5,
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
    # The name of the environment variable holding the ledger's key (it must start with one of
    # SECRET_ENV_PREFIXES, e.g. LEASEHOLD_LEDGER_KEY; the key at least 32 characters): events
    # are then chained with HMAC-SHA256 under it, so writing the table is not enough to forge
    # a chain. Empty: plain SHA-256. Configured but unreadable: no event is written.
    "LEDGER_KEY": "",
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
    # Whether OpenTelemetry spans (agentruns.tracing) carry content: prompts, the messages sent
    # and answered, tool arguments and results. Off: spans carry names, ids, counts and
    # outcomes only.
    "OTEL_CAPTURE_CONTENT": False,
    # Whether a provider that streams (openai, anthropic) streams its answers' text to the
    # playground's live view as the model writes them (docs/design.md §6.8). Only a segment a
    # live view watches streams; nothing of a stream is stored but the answer.
    "STREAM_TOKENS": True,
    # Largest framework state an external agent loop may store with its run (bytes of JSON:
    # a LangGraph thread id, an Agents SDK RunState); larger is refused (agentruns.external).
    "EXTERNAL_STATE_MAX_BYTES": 1_048_576,
}


@dataclass(frozen=True, slots=True)
class AgentrunsSettings:
    """The ``AGENTRUNS`` settings, parsed and checked: one field per name of ``DEFAULTS``, in
    lower case (``LEASE_SECONDS`` → ``lease_seconds``). Seconds may be fractions."""

    lease_seconds: float
    max_requeues: int
    max_iterations: int
    tool_timeout_seconds: float
    max_prompt_chars: int
    max_argument_chars: int
    preview_timeout_seconds: float
    redispatch_seconds: float
    stop_grace_seconds: float
    retry_backoff_seconds: float
    reconcile_checks: int
    webhook_allowlist: tuple[str, ...]
    mcp_stdio_allowed: bool
    secret_env_prefixes: tuple[str, ...]
    reaper_interval_minutes: int
    retention_days: int
    metrics_token: str
    notify_interval: int
    notify_email: bool
    notify_webhook_timeout_seconds: float
    site_url: str
    cost_currency: str
    user_daily_budget: Decimal | None
    ledger_key: str
    otel_capture_content: bool
    stream_tokens: bool
    external_state_max_bytes: int


PARSERS: dict[str, Parser] = {
    "LEASE_SECONDS": parse_seconds(zero=False),
    "MAX_REQUEUES": parse_integer(0),
    "MAX_ITERATIONS": parse_integer(1),
    "TOOL_TIMEOUT_SECONDS": parse_seconds(zero=False),
    "MAX_PROMPT_CHARS": parse_integer(1),
    "MAX_ARGUMENT_CHARS": parse_integer(1),
    "PREVIEW_TIMEOUT_SECONDS": parse_seconds(zero=False),
    "REDISPATCH_SECONDS": parse_seconds(zero=False),
    "STOP_GRACE_SECONDS": parse_seconds(zero=True),
    "RETRY_BACKOFF_SECONDS": parse_seconds(zero=True),
    "RECONCILE_CHECKS": parse_integer(0),
    "WEBHOOK_ALLOWLIST": parse_allowlist,
    "MCP_STDIO_ALLOWED": parse_boolean,
    "SECRET_ENV_PREFIXES": parse_prefixes,
    "REAPER_INTERVAL_MINUTES": parse_integer(1),
    "RETENTION_DAYS": parse_integer(0),
    "METRICS_TOKEN": parse_text,
    "NOTIFY_INTERVAL": parse_integer(0),
    "NOTIFY_EMAIL": parse_boolean,
    "NOTIFY_WEBHOOK_TIMEOUT_SECONDS": parse_seconds(zero=False),
    "SITE_URL": parse_site_url,
    "COST_CURRENCY": parse_currency,
    "USER_DAILY_BUDGET": parse_budget,
    "LEDGER_KEY": parse_text,
    "OTEL_CAPTURE_CONTENT": parse_boolean,
    "STREAM_TOKENS": parse_boolean,
    "EXTERNAL_STATE_MAX_BYTES": parse_integer(1),
}


def _warnings(configured: Mapping[Any, Any]) -> list[Problem]:
    found: list[Problem] = []
    for key in configured:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
            found.append(
                Problem(
                    UNKNOWN_NAME,
                    str(key),
                    f"AGENTRUNS[{key!r}] is not a Leasehold setting; it is ignored",
                    f"did you mean {close[0]!r}?" if close else "see agentruns.conf.DEFAULTS",
                )
            )
    prefixes = configured.get("SECRET_ENV_PREFIXES")
    # One empty string is an empty list (no secret at all, on purpose); a blank entry among
    # others, or an empty entry in a list, is a likely mistake.
    entries = (
        (prefixes.split(",") if prefixes.strip() else []) if isinstance(prefixes, str) else prefixes
    )
    if isinstance(entries, list | tuple) and any(
        isinstance(entry, str) and not entry.strip() for entry in entries
    ):
        found.append(
            Problem(
                EMPTY_SECRET_PREFIX,
                "SECRET_ENV_PREFIXES",
                f"{shown('SECRET_ENV_PREFIXES', prefixes)} has an empty entry; it is ignored "
                "(an empty prefix never allows every variable)",
                "remove the empty entry; an empty list allows no secret at all",
            )
        )
    return found


def read(configured: object) -> tuple[AgentrunsSettings | None, list[Problem]]:
    """``configured`` (the project's ``AGENTRUNS``; ``None`` when it has none) over the
    defaults: the settings, or ``None`` when any value is an error, and every problem found."""
    if configured is None:
        configured = {}
    if not isinstance(configured, Mapping):
        message = f"AGENTRUNS must be a dict, not {type(configured).__name__}"
        return None, [Problem(NOT_A_DICT, "AGENTRUNS", message)]
    problems = _warnings(configured)
    values: dict[str, Any] = {}
    for name, parse in PARSERS.items():
        raw = configured[name] if name in configured else DEFAULTS[name]
        try:
            values[name.lower()] = parse(name, raw)
        except Invalid as bad:
            problems.append(Problem(bad.id, name, bad.message, bad.hint))
    if any(problem.is_error for problem in problems):
        return None, problems
    return AgentrunsSettings(**values), problems


# --- The cached settings ---------------------------------------------------------------------

_lock = threading.Lock()
# The settings, and the ``AGENTRUNS`` object they were read from: a setting replaced without
# ``setting_changed`` (``monkeypatch.setattr(settings, "AGENTRUNS", …)``) is a different object.
_cached: tuple[object, AgentrunsSettings] | None = None
_generation = 0


def app_settings() -> AgentrunsSettings:
    """The ``AGENTRUNS`` settings, read once and cached until the setting changes (Django's
    ``setting_changed``, or another ``AGENTRUNS`` object in its place).

    Raises ``ImproperlyConfigured`` naming the first bad setting (and its check id) while any
    value is an error; nothing is cached then, so every read refuses until it is fixed.
    """
    configured = getattr(settings, "AGENTRUNS", None)
    cached = _cached
    if cached is not None and cached[0] is configured:
        return cached[1]
    return _load(configured)


def _load(configured: object) -> AgentrunsSettings:
    global _cached
    generation = _generation
    built, problems = read(configured)
    if built is None:
        error = next(problem for problem in problems if problem.is_error)
        raise ImproperlyConfigured(f"{error.message} (manage.py check: agentruns.{error.id})")
    with _lock:
        if generation == _generation:  # else the setting changed while it was read
            _cached = (configured, built)
    return built


def reset() -> None:
    """Forget the cached settings: the next ``app_settings()`` reads them again."""
    global _cached, _generation
    with _lock:
        _generation += 1
        _cached = None


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "AGENTRUNS":
        reset()


setting_changed.connect(_setting_changed, dispatch_uid="agentruns.conf.setting_changed")


# --- The environment -------------------------------------------------------------------------


def _parse(raw: str, default: Any) -> Any:
    """``raw`` as its default's type; the text itself when it does not parse (the check and
    ``app_settings()`` then report it, naming the variable)."""
    if isinstance(default, bool):
        lowered = raw.strip().lower()
        if lowered in TRUE_WORDS:
            return True
        if lowered in FALSE_WORDS:
            return False
        return raw
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            return raw
    if isinstance(default, list | tuple):
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def parse_env_overrides(defaults: Mapping[str, Any], environ: Mapping[str, str]) -> dict:
    """A copy of the defaults (lists not shared) with every ``AGENTRUNS_<NAME>`` applied."""
    result = copy.deepcopy(dict(defaults))
    for name, default in defaults.items():
        raw = environ.get(f"AGENTRUNS_{name}")
        if raw is not None:
            result[name] = _parse(raw, default)
    return result


def settings_from_env(environ: Mapping[str, str]) -> dict:
    """A complete ``AGENTRUNS`` setting: ``DEFAULTS`` with the environment's overrides applied.

    Never raises: a value that does not parse (``AGENTRUNS_MAX_REQUEUES=three``) is kept as its
    text, so the settings module always imports; ``manage.py check`` reports it and
    ``app_settings()`` refuses it, naming the variable.
    """
    return parse_env_overrides(DEFAULTS, environ)
