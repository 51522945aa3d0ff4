"""JSON-schema helpers for tool arguments and human input: the one validation path.

Owns how a schema is checked and how a validation failure is reported: ``schema_errors`` and
``input_errors`` return ``SchemaError`` values (a path and a message) that every interface uses —
the model's tool message, the API's 422 body, the input forms' field errors. No caller parses a
message back. It knows nothing about tools, runs or the registry; it must never touch the
database.

A path is the list of keys leading from the validated object to the value that failed: strings
for object properties, integers for array items (``("tags", 2)``: item 2 of ``tags``); the empty
path is the object itself. As JSON it is an array (``["tags", 2]``), so a key holding ``/`` or
``.`` is never ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema import exceptions as jsonschema_exceptions
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

# At most this many errors are reported for one instance, so a huge instance cannot flood a
# transcript or a page; an extra last entry says how many more were left out.
MAX_REPORTED_ERRORS = 5
MAX_MESSAGE_CHARS = 300

PathPart = str | int


class InvalidSchema(ValueError):
    """A tool declared a JSON schema that is not a valid schema."""


@dataclass(frozen=True)
class SchemaError:
    """One way an instance breaks a schema: where (``path``, see the module docstring) and what.

    ``str()`` is ``"<key>/<key>: <message>"``, or the message alone at the root: the wording a
    model or a human reads.
    """

    path: tuple[PathPart, ...]
    message: str

    def as_dict(self) -> dict[str, Any]:
        """``{"path": [...], "message": "..."}`` for a JSON body."""
        return {"path": list(self.path), "message": self.message}

    def below(self, depth: int) -> SchemaError:
        """The same error with its first ``depth`` keys dropped (relative to a nested value)."""
        return SchemaError(self.path[depth:], self.message)

    def __str__(self) -> str:
        if not self.path:
            return self.message
        return "/".join(str(part) for part in self.path) + ": " + self.message


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
    except jsonschema_exceptions.SchemaError as exc:
        raise InvalidSchema(f"{what} is not a valid JSON schema: {exc.message}") from exc
    if schema.get("type") != "object":
        raise InvalidSchema(f'{what} must have "type": "object"')
    if not isinstance(schema.get("properties", {}), Mapping):
        raise InvalidSchema(f'{what} "properties" must be an object')


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _order(error: SchemaError) -> tuple[Any, ...]:
    # Array items numerically (item 2 before item 10); at one depth an index sorts before a key
    # so mixed parts never compare. Then the message: jsonschema's own order follows the
    # schema's key order, which a jsonb round trip does not keep.
    path = tuple((0, part, "") if isinstance(part, int) else (1, 0, part) for part in error.path)
    return (path, error.message)


def schema_errors(schema: Mapping[str, Any], instance: Any) -> list[SchemaError]:
    """Every way ``instance`` breaks ``schema``; empty if it is valid.

    Sorted by path (the root first, a parent before its children, array items by index), then
    by message, so the same instance always yields the same list. A missing required property
    is reported at the object that lacks it. Messages are cut at ``MAX_MESSAGE_CHARS``. At most
    ``MAX_REPORTED_ERRORS`` errors; when more were found, one more entry at the root path,
    ``"... and N more"``, says how many were left out.
    """
    validator = _validator_class(schema)(schema)
    found = sorted(
        (
            SchemaError(tuple(e.absolute_path), _short(e.message))
            for e in validator.iter_errors(instance)
        ),
        key=_order,
    )
    if len(found) <= MAX_REPORTED_ERRORS:
        return found
    left_out = len(found) - MAX_REPORTED_ERRORS
    return [*found[:MAX_REPORTED_ERRORS], SchemaError((), f"... and {left_out} more")]


def input_errors(schema: Mapping[str, Any], values: Any) -> list[SchemaError]:
    """``schema_errors`` for values a human supplies: they must be an object (one error at the
    root says so otherwise), then match ``schema``."""
    if not isinstance(values, Mapping):
        return [SchemaError((), f"values must be an object, got {type(values).__name__}")]
    return schema_errors(schema, dict(values))
