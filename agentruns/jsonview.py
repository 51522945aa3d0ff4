"""Stored JSON shown to people: the one way the admin, the inbox and the playground print a
value (arguments, results, pending turns, schemas). Text only; the caller escapes it."""

from __future__ import annotations

import json
from typing import Any


def pretty_json(value: Any) -> str:
    """Indented (two spaces), key-sorted JSON text with non-ASCII characters kept, so the same
    value always prints the same. A leaf JSON cannot hold (a datetime, a UUID) prints as its
    ``str``; a value that cannot be printed as JSON at all (a cycle, keys of mixed types) as its
    ``repr``. Not shortened: the templates fold long blocks."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def pretty_arguments(value: Any) -> str:
    """A call's arguments as ``pretty_json`` prints a value, but with keys in the order they
    are held (the order the model sent them: ``agentruns.turns.ordered_arguments``)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)
