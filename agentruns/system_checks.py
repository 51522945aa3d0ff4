"""System checks of the ``AGENTRUNS`` settings (``manage.py check``, and every command that
runs checks): bad configuration reported at startup, with an id, before anything runs on it."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register

from agentruns import ledger


@register()
def check_ledger_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``agentruns.E010``: ``AGENTRUNS_LEDGER_KEY`` is set but its key cannot be read (a name
    the secret rule refuses, an unset variable, a key shorter than 32 characters): every event
    write would be refused."""
    problem = ledger.key_problem()
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
