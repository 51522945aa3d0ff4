"""Turn digests: what binds a human decision to the turn the human saw (RUNS.md §6)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_digest(
    calls: Iterable[Mapping[str, Any]], *, input_schema: Mapping[str, Any] | None = None
) -> str:
    """SHA-256 of the canonical JSON of the pending calls (id, name and arguments).

    The call id is included beside the name and arguments so that a model proposing the very
    same call in a later turn gets a new digest: a decision for the old turn is then "already
    decided", never silently valid for the new one. The input digest also covers the schema.
    """
    body: dict[str, Any] = {
        "calls": [
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
            for c in calls
        ]
    }
    if input_schema is not None:
        body["input_schema"] = input_schema
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()
