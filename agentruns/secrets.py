"""Secrets by name: which environment variables a configuration may read a secret from.

Owns the rule of docs/design.md §12.4. A configuration (``api_key_env``) or an MCP server
(``headers_env``) names the environment variable that holds a secret; only names starting with
one of ``AGENTRUNS["SECRET_ENV_PREFIXES"]`` (default ``LEASEHOLD_``) may be named, so whoever
edits a row in the admin cannot have the process send its other secrets (``DJANGO_SECRET_KEY``,
``DATABASE_URL``…) to an address of their choosing. The models check it when a row is validated;
``read_secret_env`` checks it again before every read, so a row written some other way sends
nothing. Never puts a secret's value in a message.
"""

from __future__ import annotations

import os
import re

from agentruns.conf import app_settings
from agentruns.exceptions import SecretEnvRefused

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def allowed_prefixes() -> tuple[str, ...]:
    """The configured prefixes (a list, or one comma-separated string), empty entries dropped
    (``agentruns.conf``: never a wildcard)."""
    return app_settings().secret_env_prefixes


def secret_env_problem(name: object) -> str | None:
    """Why ``name`` may not be named as a secret's environment variable, or None when it may."""
    if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
        return f"{name!r} is not an environment variable name (letters, digits and _)"
    prefixes = allowed_prefixes()
    if name.startswith(prefixes):
        return None
    if not prefixes:
        return (
            f"{name} may not hold a secret: no variable may "
            "(AGENTRUNS['SECRET_ENV_PREFIXES'] is empty)"
        )
    allowed = " or ".join(prefixes)
    return (
        f"{name} may not hold a secret: only variables whose names start with {allowed} may "
        "(AGENTRUNS['SECRET_ENV_PREFIXES'])"
    )


def check_secret_env(name: object, *, what: str) -> None:
    """Raise ``SecretEnvRefused`` (saying ``what`` named it) unless ``name`` may be named."""
    problem = secret_env_problem(name)
    if problem is not None:
        raise SecretEnvRefused(f"{what}: {problem}", variable=str(name))


def read_secret_env(name: object, *, what: str) -> str | None:
    """The value of the environment variable ``name`` (None when unset), after
    ``check_secret_env``: a refused name raises ``SecretEnvRefused`` and is never read."""
    check_secret_env(name, what=what)
    return os.environ.get(str(name))
