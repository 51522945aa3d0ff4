"""JSON-schema helpers for tool arguments and human input: the one validation path.

Owns how a schema is checked and how a validation failure is reported: ``schema_errors`` and
``input_errors`` return ``SchemaError`` values (a path and a message) that every interface uses —
the model's tool message, the API's 422 body, the input forms' field errors. No caller parses a
message back. It knows nothing about tools, runs or the registry; it must never touch the
database.

References stay inside the schema: ``check_schema`` refuses a ``$ref`` (``$dynamicRef``,
``$recursiveRef``) that does not start with ``#``, and validation resolves references through a
registry that retrieves nothing, so no schema ever makes Leasehold fetch a URL (jsonschema's
default downloads a remote reference, with no timeout and no allowlist).

A check is bounded: a schema's regular expressions run on RE2 (``agentruns.tools.patterns``:
linear in what they read, within a budget of characters read per check; a pattern RE2 cannot
compile makes the schema unusable), a value larger than ``AGENTRUNS_MAX_ARGUMENT_CHARS``
characters of JSON or nested deeper than ``MAX_ARGUMENT_DEPTH`` is refused unchecked (one error
at the root says so), and a schema that recurses without end is unusable rather than a crash.

A path is the list of keys leading from the validated object to the value that failed: strings
for object properties, integers for array items (``("tags", 2)``: item 2 of ``tags``); the empty
path is the object itself. As JSON it is an array (``["tags", 2]``), so a key holding ``/`` or
``.`` is never ambiguous.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

from agentruns.conf import app_settings
from agentruns.tools.patterns import (
    PatternRefused,
    ScanBudgetExceeded,
    bounded_validator,
    format_checker,
    scan_budget,
    schema_problem,
)

# At most this many errors are reported for one instance, so a huge instance cannot flood a
# transcript or a page; an extra last entry says how many more were left out.
MAX_REPORTED_ERRORS = 5
MAX_MESSAGE_CHARS = 300
# The deepest nesting (objects and arrays) of a value checked against a schema: jsonschema
# descends recursively, and a deeper value would exhaust Python's stack.
MAX_ARGUMENT_DEPTH = 64
# One check's patterns may read at most this many times AGENTRUNS_MAX_ARGUMENT_CHARS characters
# in all (``patterns.scan_budget``): a value read once or a few times is never near it, a schema
# applying dozens of expressions to the same text is stopped.
SCAN_BUDGET_FACTOR = 8

PathPart = str | int

# The keys whose string value is a reference to another schema.
REFERENCE_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")

# Every validation resolves references here: the schema itself (and the bundled metaschemas,
# which jsonschema adds) and nothing else — its ``retrieve`` refuses every URI, so an
# unresolvable reference is an ``InvalidSchema``, never a download.
_NO_RETRIEVAL: Registry[Any] = Registry()


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
    """The validator the schema asks for via ``$schema`` (Draft 2020-12 when it says nothing),
    its regular expressions run by RE2 (``patterns.bounded_validator``)."""
    return bounded_validator(validator_for(schema, default=Draft202012Validator))


def _build(schema: Mapping[str, Any]) -> Validator:
    """A validator of ``schema``; ``InvalidSchema`` when a check could not be bounded
    (``patterns.schema_problem``)."""
    problem = schema_problem(schema)
    if problem is not None:
        raise InvalidSchema(f"the schema cannot be checked: {problem}")
    return _validator_class(schema)(schema, registry=_NO_RETRIEVAL)


# Validators built for the schemas validated lately (every tool call validates its arguments,
# twice: building the validator cost more than validating). Keyed by the schema object's
# identity; an entry holds the object (so its id is not reused while cached) and its JSON text
# when the validator was built, and serves only that same object with that same text: a schema
# mutated since is built again, and two schemas never share a validator.
_VALIDATORS: dict[int, tuple[Mapping[str, Any], str, Validator]] = {}
_MAX_VALIDATORS = 256
_schema_text = json.JSONEncoder(separators=(",", ":")).encode


def _validator(schema: Mapping[str, Any]) -> Validator:
    """A validator of ``schema`` resolving through ``_NO_RETRIEVAL`` (cached, see above)."""
    try:
        text = _schema_text(schema)
    except (TypeError, ValueError, RecursionError):  # not JSON (e.g. circular): never cached
        return _build(schema)
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema and cached[1] == text:
        return cached[2]
    validator = _build(schema)
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, text, validator)
    return validator


def remote_references(schema: Any) -> list[str]:
    """The references in ``schema`` that point outside it, in the order found: every string value
    of a ``REFERENCE_KEYS`` key, at any depth, that does not start with ``#``. A key's value that
    is not a string (a property *named* ``$ref``) is not a reference."""
    found: list[str] = []
    stack: list[Any] = [schema]
    while stack:  # iterative: a deeply nested schema cannot exhaust the stack
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in REFERENCE_KEYS and isinstance(value, str):
                    if not value.startswith("#") and value not in found:
                        found.append(value)
                elif isinstance(value, Mapping | list):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return found


def _metaschema_error(schema: Mapping[str, Any]) -> str | None:
    """The first way ``schema`` breaks its draft's metaschema (formats checked, so a ``pattern``
    must compile with RE2), or None. jsonschema's ``check_schema``, resolving through
    ``_NO_RETRIEVAL``."""
    draft = _validator_class(schema)
    meta = bounded_validator(validator_for(draft.META_SCHEMA, default=draft))
    checker = meta(
        draft.META_SCHEMA,
        registry=_NO_RETRIEVAL,
        format_checker=format_checker(meta.FORMAT_CHECKER),
    )
    try:
        for error in checker.iter_errors(schema):
            return error.message
    except RecursionError:
        return "it refers to itself without end"
    return None


def check_schema(schema: Any, *, what: str) -> None:
    """Raise ``InvalidSchema`` unless ``schema`` is a valid object schema.

    An object schema is a mapping with ``"type": "object"`` and, if present, a mapping of
    ``properties``: tool arguments and human input are always JSON objects. Every ``pattern``
    (and ``patternProperties`` key) must compile with RE2 (``patterns.schema_problem``: the
    reason names the pattern), every reference must be local (``remote_references`` is empty):
    a schema may not make Leasehold fetch anything.
    """
    if not isinstance(schema, Mapping):
        raise InvalidSchema(f"{what} must be a JSON schema object, got {type(schema).__name__}")
    bounded = schema_problem(schema)
    if bounded is not None:
        raise InvalidSchema(f"{what} cannot be checked: {bounded}")
    problem = _metaschema_error(schema)
    if problem is not None:
        raise InvalidSchema(f"{what} is not a valid JSON schema: {problem}")
    if schema.get("type") != "object":
        raise InvalidSchema(f'{what} must have "type": "object"')
    if not isinstance(schema.get("properties", {}), Mapping):
        raise InvalidSchema(f'{what} "properties" must be an object')
    remote = remote_references(schema)
    if remote:
        raise InvalidSchema(
            f"{what} refers to {_short(remote[0])!r}: only references inside the schema "
            "(starting with '#') are allowed"
        )


def check_matching_schema(schema: Any, *, what: str) -> None:
    """Raise ``InvalidSchema`` unless ``schema`` is a JSON schema object Leasehold can apply to
    a value in bounded time (a standing approval's ``arguments_schema``: any keywords, no
    ``"type": "object"`` needed): no larger than a tool's arguments may be
    (``size_problem``), every pattern compiles with RE2 and the walk is bounded
    (``patterns.schema_problem``), valid against its draft's metaschema, references local only,
    and applying it to an empty object neither recurses without end nor meets a reference that
    does not resolve."""
    if not isinstance(schema, Mapping):
        raise InvalidSchema(f"{what} must be a JSON schema object, got {type(schema).__name__}")
    too_big = size_problem(schema)
    if too_big is not None:
        raise InvalidSchema(f"{what} is too large: {too_big.replace('the value', 'it')}")
    bounded = schema_problem(schema)
    if bounded is not None:
        raise InvalidSchema(f"{what} cannot be checked: {bounded}")
    problem = _metaschema_error(schema)
    if problem is not None:
        raise InvalidSchema(f"{what} is not a valid JSON schema: {_short(problem)}")
    remote = remote_references(schema)
    if remote:
        raise InvalidSchema(
            f"{what} refers to {_short(remote[0])!r}: only references inside the schema "
            "(starting with '#') are allowed"
        )
    try:
        schema_errors(schema, {})
    except InvalidSchema as exc:
        raise InvalidSchema(f"{what} cannot be applied: {exc}") from None


def size_problem(instance: Any) -> str | None:
    """Why ``instance`` is too large to check, or None: more than
    ``AGENTRUNS_MAX_ARGUMENT_CHARS`` characters of JSON (counted without escapes: a lower
    bound) or objects and arrays nested deeper than ``MAX_ARGUMENT_DEPTH``. Iterative, and it
    stops as soon as either bound is passed."""
    limit = app_settings().max_argument_chars
    total = 0
    stack: list[tuple[Any, int]] = [(instance, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            total += len(value) + 2
        elif isinstance(value, Mapping | list | tuple):
            if depth >= MAX_ARGUMENT_DEPTH:
                return (
                    f"the value is nested deeper than {MAX_ARGUMENT_DEPTH} levels of objects "
                    "and arrays; it was not checked"
                )
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            total += 2
            for key, item in items:
                total += 1 + (len(key) + 3 if isinstance(key, str) else 0)
                stack.append((item, depth + 1))
        elif isinstance(value, int) and not isinstance(value, bool):
            total += value.bit_length() // 3 + 1  # about its digits, without writing them
        elif isinstance(value, float):
            total += len(repr(value))
        else:
            total += 5  # true, false, null
        if total > limit:
            return (
                f"the value is larger than {limit} characters of JSON "
                "(AGENTRUNS_MAX_ARGUMENT_CHARS); it was not checked"
            )
    return None


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

    Bounded: an instance over ``AGENTRUNS_MAX_ARGUMENT_CHARS`` characters of JSON or nested
    deeper than ``MAX_ARGUMENT_DEPTH``, or whose check would read more than
    ``SCAN_BUDGET_FACTOR`` times that many characters with the schema's patterns, is not checked
    (refused); the one error, at the root, says so.

    Nothing is retrieved: a reference the schema does not itself contain, a ``pattern`` RE2
    cannot compile or a reference that recurses without end raises ``InvalidSchema`` (the
    schema is unusable; a schema that passed ``check_schema`` has no such pattern and no remote
    reference).
    """
    too_big = size_problem(instance)
    if too_big is not None:
        return [SchemaError((), too_big)]
    validator = _validator(schema)
    budget = SCAN_BUDGET_FACTOR * app_settings().max_argument_chars
    try:
        with scan_budget(budget):
            found = sorted(
                (
                    SchemaError(tuple(e.absolute_path), _short(e.message))
                    for e in validator.iter_errors(instance)
                ),
                key=_order,
            )
    except ScanBudgetExceeded as exc:
        return [SchemaError((), f"{exc}; it was not checked")]
    except Unresolvable as exc:
        raise InvalidSchema(
            f"the schema has a reference that does not resolve: {_short(str(exc))}"
        ) from exc
    except PatternRefused as exc:
        raise InvalidSchema(f"the schema cannot be checked: {exc}") from exc
    except RecursionError:
        raise InvalidSchema("the schema refers to itself without end") from None
    if len(found) <= MAX_REPORTED_ERRORS:
        return found
    left_out = len(found) - MAX_REPORTED_ERRORS
    return [*found[:MAX_REPORTED_ERRORS], SchemaError((), f"... and {left_out} more")]


def input_errors(schema: Mapping[str, Any], values: Any) -> list[SchemaError]:
    """``schema_errors`` for values a human supplies: they must be an object (one error at the
    root says so otherwise), then match ``schema``. ``InvalidSchema`` as ``schema_errors``."""
    if not isinstance(values, Mapping):
        return [SchemaError((), f"values must be an object, got {type(values).__name__}")]
    return schema_errors(schema, dict(values))
