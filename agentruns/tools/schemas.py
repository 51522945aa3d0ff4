"""JSON-schema helpers for tool arguments and human input.

Owns how a schema is checked and how a validation failure is worded. It knows nothing about
tools, runs or the registry; it must never touch the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

# Validation error messages shown to a model or a human are capped so a huge instance cannot
# flood a transcript.
MAX_REPORTED_ERRORS = 5
MAX_MESSAGE_CHARS = 300


class InvalidSchema(ValueError):
    """A tool declared a JSON schema that is not a valid schema."""


def _validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    """The validator the schema asks for via ``$schema``; Draft 2020-12 when it says nothing."""
    return validator_for(schema, default=Draft202012Validator)


def check_schema(schema: Any, *, what: str) -> None:
    """Raise ``InvalidSchema`` unless ``schema`` is a valid object schema.

    An object schema is a mapping with ``"type": "object"`` and, if present, a mapping of
    ``properties``: tool arguments and human input are always JSON objects.
    """
    if not isinstance(schema, Mapping):
        raise InvalidSchema(f"{what} must be a JSON schema object, got {type(schema).__name__}")
    try:
        _validator_class(schema).check_schema(schema)  # type: ignore[arg-type]  # stubs: dict only
    except SchemaError as exc:
        raise InvalidSchema(f"{what} is not a valid JSON schema: {exc.message}") from exc
    if schema.get("type") != "object":
        raise InvalidSchema(f'{what} must have "type": "object"')
    if not isinstance(schema.get("properties", {}), Mapping):
        raise InvalidSchema(f'{what} "properties" must be an object')


def _where(path: Any) -> str:
    parts = [str(part) for part in path]
    return "/".join(parts) if parts else "(root)"


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def schema_errors(schema: Mapping[str, Any], instance: Any) -> list[str]:
    """Every way ``instance`` breaks ``schema``, worded ``"<path>: <problem>"``; empty if valid.

    Sorted by path so the same instance always yields the same list; at most
    ``MAX_REPORTED_ERRORS`` entries (the last says how many more were left out).
    """
    validator = _validator_class(schema)(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.path])
    messages = [f"{_where(e.path)}: {_short(e.message)}" for e in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        messages.append(f"... and {len(errors) - MAX_REPORTED_ERRORS} more")
    return messages
