"""The ``AGENTRUNS`` settings: documented defaults, each overridable by ``AGENTRUNS_<NAME>``.

Must not import Django models: ``config.settings`` imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured


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
    """Return the defaults with every ``AGENTRUNS_<NAME>`` in ``environ`` applied."""
    result = dict(defaults)
    for name, default in defaults.items():
        raw = environ.get(f"AGENTRUNS_{name}")
        if raw is not None:
            result[name] = _parse(name, raw, default)
    return result


def get(name: str) -> Any:
    """One ``AGENTRUNS`` value, read at call time so ``override_settings`` works in tests."""
    from django.conf import settings

    from config.settings.base import AGENTRUNS_DEFAULTS

    configured = getattr(settings, "AGENTRUNS", {})
    if name in configured:
        return configured[name]
    if name in AGENTRUNS_DEFAULTS:
        return AGENTRUNS_DEFAULTS[name]
    raise ImproperlyConfigured(f"Unknown AGENTRUNS setting {name!r}")
