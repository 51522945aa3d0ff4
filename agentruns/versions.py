"""Pinned configuration versions (docs/configuration-versions.md): what of a configuration a
version holds, its snapshot as JSON and back, and the configuration a run sees.

The one module that reads and writes ``ConfigurationVersion.snapshot``. A version is immutable,
so its parsed values are cached in-process by id (``pinned_values``): after a process first
reads a version, a segment, a decision or a card reads no row for it.

``pinned_configuration(run)`` is the configuration as the run sees it: the live row's identity
and the settings about people (``LIVE_FIELDS``: who may approve, where notices go, the daily
budget, whether it is active), every setting of ``PINNED_FIELDS`` from the version the run
pinned. Two approval switches that decide *how people may decide* take the stricter of pinned and
live (``require_second_approver``: either on; ``allow_chat_approval``: both on), so an operator
who tightens them reaches runs already waiting, and loosening them reaches only new runs.

A snapshot that does not parse (a row changed by hand) raises ``UnreadableVersion``: nothing runs
under settings nobody can read.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import threading
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import models
from django.utils.dateparse import parse_duration
from django.utils.duration import duration_iso_string

from agentruns.jsonview import pretty_json
from agentruns.models.configuration import AgentConfiguration

if TYPE_CHECKING:
    from agentruns.models import AgentRun

#: What a version pins: everything that governs how a run executes — its provider and script,
#: prompt, tools, round cap, output schema, approval policy, deadlines and prices. A change to
#: any of them makes a new version.
PINNED_FIELDS: tuple[str, ...] = (
    "provider",
    "model",
    "base_url",
    "api_key_env",
    "timeout_seconds",
    "max_output_tokens",
    "system_prompt",
    "tools",
    "max_iterations",
    "script",
    "output_schema",
    "require_second_approver",
    "preview_is_snapshot",
    "allow_chat_approval",
    "approval_timeout",
    "on_approval_timeout",
    "escalation_timeout",
    "on_escalation_timeout",
    "price_per_million_prompt_tokens",
    "price_per_million_completion_tokens",
    "max_tokens_per_call",
)

#: What stays live (read from the configuration's row, never versioned): its identity, whether
#: it is active (a deactivation stops its runs at once), the people (approver and escalation
#: groups), where notices go, whether standing approvals exist, and the daily budget (one
#: spend ledger for all its runs: lowering it is a brake that must reach runs already going).
LIVE_FIELDS: tuple[str, ...] = (
    "slug",
    "name",
    "is_active",
    "approver_group",
    "escalation_group",
    "notify_webhook_url",
    "daily_budget",
    "has_standing_rules",
)

_JSON_FIELDS = frozenset({"tools", "script", "output_schema"})
_CACHE_LIMIT = 4096


class UnreadableVersion(Exception):
    """A version's snapshot does not hold what ``PINNED_FIELDS`` needs."""


@dataclass(frozen=True)
class PinnedValues:
    """A version as parsed: its ``number``, its configuration and each pinned field's value as
    the model field holds it (``values``; JSON values are copied out, never handed over)."""

    version_id: int
    configuration_id: int
    number: int
    values: dict[str, Any]

    @property
    def label(self) -> str:
        return f"v{self.number}"


# --- Snapshot and hash ---------------------------------------------------------------------------


def _field(name: str) -> models.Field[Any, Any]:
    field = AgentConfiguration._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field


def _to_json(name: str, value: Any) -> Any:
    """A pinned field's value as JSON, canonical: a decimal at the column's places, a duration
    as ISO 8601 (so the same setting always hashes the same, however it was typed)."""
    if value is None:
        return None
    if isinstance(value, Decimal):
        places = _field(name).decimal_places or 0  # type: ignore[attr-defined]
        return format(value.quantize(Decimal(1).scaleb(-places)), "f")
    if isinstance(value, timedelta):
        return duration_iso_string(value)
    return value


def snapshot_of(configuration: AgentConfiguration) -> dict[str, Any]:
    """The pinned fields of ``configuration`` as it stands (in memory) as a JSON object."""
    return {name: _to_json(name, getattr(configuration, name)) for name in PINNED_FIELDS}


def content_hash(snapshot: dict[str, Any]) -> str:
    """SHA-256 of the snapshot as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _from_json(name: str, value: Any) -> Any:
    if value is None or name in _JSON_FIELDS:
        return value
    if name in ("approval_timeout", "escalation_timeout"):
        parsed = parse_duration(value) if isinstance(value, str) else None
        if parsed is None:
            raise UnreadableVersion(f"{name} is not a duration: {value!r}")
        return parsed
    try:
        return _field(name).to_python(value)
    except (ValidationError, InvalidOperation, TypeError, ValueError) as exc:
        raise UnreadableVersion(f"{name} does not read: {value!r}") from exc


def parse_snapshot(snapshot: Any) -> dict[str, Any]:
    """The pinned fields' values from a stored snapshot; ``UnreadableVersion`` when one is
    missing or does not read."""
    if not isinstance(snapshot, dict):
        raise UnreadableVersion("the snapshot is not a JSON object")
    missing = [name for name in PINNED_FIELDS if name not in snapshot]
    if missing:
        raise UnreadableVersion(f"the snapshot lacks {', '.join(missing)}")
    return {name: _from_json(name, snapshot[name]) for name in PINNED_FIELDS}


# --- The cache of immutable versions ------------------------------------------------------------

_cache: dict[int, PinnedValues] = {}
_cache_lock = threading.Lock()


def remember(version: Any) -> PinnedValues:
    """Parse ``version`` (a ``ConfigurationVersion`` just read or written) and keep it."""
    pinned = PinnedValues(
        version_id=version.pk,
        configuration_id=version.configuration_id,
        number=version.number,
        values=parse_snapshot(version.snapshot),
    )
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[version.pk] = pinned
    return pinned


def forget_all() -> None:
    """Empty the cache (tests: a rolled-back SQLite database may reuse an id)."""
    with _cache_lock:
        _cache.clear()


def pinned_values(version_id: int, *, loaded: Any = None) -> PinnedValues:
    """The version ``version_id`` as parsed: from the cache, else from ``loaded`` (the row, read
    with the run by ``select_related``), else read (one query); then kept."""
    hit = _cache.get(version_id)
    if hit is not None:
        return hit
    if loaded is not None and loaded.pk == version_id:
        return remember(loaded)
    from agentruns.models import ConfigurationVersion

    return remember(ConfigurationVersion.objects.get(pk=version_id))


def _of_run(run: AgentRun) -> PinnedValues:
    """``run``'s version, from the row read with it when a query selected it."""
    from agentruns.models import AgentRun

    descriptor = AgentRun.config_version
    loaded = run.config_version if descriptor.is_cached(run) else None
    return pinned_values(run.config_version_id, loaded=loaded)


# --- What a run sees ----------------------------------------------------------------------------


def pinned_configuration(run: AgentRun) -> AgentConfiguration:
    """``run``'s configuration as the run sees it: the live row (``run.configuration``, as
    loaded with the run) with every pinned field from ``run``'s version, the approval switches
    the stricter of both (module docstring). A copy: the live instance is left as it is. One
    already pinned is returned as it is. Never saved (``AgentConfiguration.save`` refuses)."""
    live = run.configuration
    version_id = run.config_version_id
    shown = live.pinned_version
    if shown is not None and shown.version_id == version_id:
        return live
    pinned = _of_run(run)
    if pinned.configuration_id != live.pk:
        raise UnreadableVersion(f"version {version_id} is not of configuration {live.pk}")
    view = copy.copy(live)
    for name, value in pinned.values.items():
        setattr(view, name, copy.deepcopy(value) if name in _JSON_FIELDS else value)
    view.require_second_approver = bool(
        pinned.values["require_second_approver"] or live.require_second_approver
    )
    view.allow_chat_approval = bool(
        pinned.values["allow_chat_approval"] and live.allow_chat_approval
    )
    view.pinned_version = pinned
    return view


def pin(run: AgentRun) -> AgentRun:
    """Make ``run.configuration`` the configuration as the run sees it (``pinned_configuration``)
    and return ``run``: every reader of ``run.configuration`` then reads the pinned settings."""
    run.configuration = pinned_configuration(run)
    return run


def pinned_or_live(run: AgentRun) -> AgentConfiguration:
    """For display: ``pinned_configuration(run)``, or the live row when the version cannot be
    read (a page never fails on it; the run itself would not run)."""
    try:
        return pinned_configuration(run)
    except Exception:  # display only: never a failed page
        return run.configuration


def version_number(run: AgentRun) -> int:
    """The number of the version ``run`` pinned (cached; 0 when it cannot be read)."""
    try:
        return _of_run(run).number
    except Exception:  # a missing or unreadable row: shown as unknown, never a failed page
        return 0


def version_label(run: AgentRun) -> str:
    """``v3``: the version ``run`` pinned (cached; ``""`` when it cannot be read)."""
    try:
        return _of_run(run).label
    except Exception:  # a missing or unreadable row: shown as unknown, never a failed page
        return ""


# --- The admin's diff ---------------------------------------------------------------------------


def pretty(snapshot: Any) -> str:
    """A snapshot as indented JSON with sorted keys (what the admin shows and diffs)."""
    return pretty_json(snapshot)


def diff_lines(old: Any, new: Any, *, old_label: str, new_label: str) -> list[str]:
    """The unified diff of two snapshots' pretty JSON (plain text: the caller escapes it)."""
    return list(
        difflib.unified_diff(
            pretty(old).splitlines(),
            pretty(new).splitlines(),
            fromfile=old_label,
            tofile=new_label,
            lineterm="",
        )
    )
