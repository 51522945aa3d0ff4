"""Regular expressions in JSON schemas, run by RE2: a check's time grows with the length of
what it reads, never exponentially (no backtracking).

Owns every regular expression a schema brings — the ``pattern`` keyword, the keys of
``patternProperties`` (and so ``additionalProperties`` beside them) and the metaschema's
``regex`` format — and the validator classes that run them (``bounded_validator``: jsonschema's
own class for the schema's draft with those keywords replaced). Python's ``re`` never runs a
schema's expression: a pattern RE2 cannot compile (a backreference, a lookaround, ``\\Z``) is
an unusable schema with a readable reason (``schema_problem``), never checked another way.

What RE2 reads is the ECMA-262 dialect JSON Schema names, as far as both agree: ``\\d``, ``\\w``
and ``\\s`` are ASCII, ``$`` is the end of the text only, ``\\p{L}`` works; ``\\uXXXX`` escapes
(surrogate pairs too) are translated to RE2's ``\\x{…}``. Compiled expressions are kept
(least recently used) with RE2's memory bound, ``MAX_PATTERN_MEMORY``; an expression that needs
more is refused like one that does not compile.

jsonschema's ``unevaluatedProperties`` matches ``patternProperties`` with ``re``, so a schema
using both is refused; nothing else of jsonschema runs a schema's expression. Pure functions:
no database, no settings.

RE2's time is linear in the text, but a schema can apply many expressions to the same text
(``allOf`` of copies, ``patternProperties`` against every key). Inside ``scan_budget(n)`` the
characters every search reads are counted, and a check that would read more than ``n`` stops
with ``ScanBudgetExceeded``: deterministic (it depends on the schema and the value, never on the
clock).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import FormatChecker
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

# RE2's memory budget for one compiled expression (its program and its DFA cache); an
# expression whose program does not fit is refused ("pattern too large").
MAX_PATTERN_MEMORY = 8 * 1024 * 1024
# How many compiled expressions are kept (each holds up to MAX_PATTERN_MEMORY).
KEPT_PATTERNS = 128
# The deepest nesting (objects and arrays) a schema may have: jsonschema checks a schema
# against its metaschema recursively, and a deeper one would exhaust Python's stack.
MAX_SCHEMA_DEPTH = 100
MAX_SHOWN_PATTERN_CHARS = 80

# Keywords whose value is data, never a schema: nothing below them is a pattern.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names (never patterns) to subschemas.
_NAMED_SUBSCHEMAS = frozenset(
    {"properties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)


class PatternRefused(ValueError):
    """A schema's regular expression that RE2 cannot run (the message says why)."""


class ScanBudgetExceeded(ValueError):
    """A check would read more characters with the schema's expressions than its budget."""


@dataclass
class _Budget:
    limit: int
    spent: int = 0


_BUDGET: ContextVar[_Budget | None] = ContextVar("pattern_scan_budget", default=None)


@contextlib.contextmanager
def scan_budget(limit: int) -> Iterator[None]:
    """Within the block, the searches of this thread may read at most ``limit`` characters in
    all; the search that would pass it raises ``ScanBudgetExceeded`` instead of running."""
    token = _BUDGET.set(_Budget(limit))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def _search(regexp: re2._Regexp[str], text: str) -> bool:
    budget = _BUDGET.get()
    if budget is not None:
        budget.spent += len(text)
        if budget.spent > budget.limit:
            raise ScanBudgetExceeded(
                f"checking the value would read more than {budget.limit} characters with the "
                "schema's patterns"
            )
    return regexp.search(text) is not None


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False  # a refusal is reported to the operator, not to stderr
    return options


_OPTIONS = _options()


def _shown(pattern: str) -> str:
    if len(pattern) <= MAX_SHOWN_PATTERN_CHARS:
        return repr(pattern)
    return repr(pattern[: MAX_SHOWN_PATTERN_CHARS - 1] + "…")


def _is_hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)


def ecma_to_re2(pattern: str) -> str:
    """``pattern`` with every ECMA-262 ``\\uXXXX`` escape written as RE2's ``\\x{XXXX}`` (a
    surrogate pair as the one code point it encodes); every other escape is kept as written
    (an escaped backslash stays one: ``\\\\u0041`` is a backslash then ``u0041``)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char != "\\" or i + 1 >= len(pattern):
            out.append(char)
            i += 1
            continue
        if pattern[i + 1] == "u" and _is_hex(pattern[i + 2 : i + 6]):
            code = int(pattern[i + 2 : i + 6], 16)
            i += 6
            low = pattern[i + 2 : i + 6] if pattern[i : i + 2] == "\\u" else ""
            if 0xD800 <= code <= 0xDBFF and _is_hex(low) and 0xDC00 <= int(low, 16) <= 0xDFFF:
                code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
                i += 6
            out.append(f"\\x{{{code:X}}}")
            continue
        out.append(pattern[i : i + 2])
        i += 2
    return "".join(out)


@functools.lru_cache(maxsize=KEPT_PATTERNS)
def _compiled(pattern: str) -> tuple[re2._Regexp[str] | None, str]:
    try:
        return re2.compile(ecma_to_re2(pattern), _OPTIONS), ""
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", errors="replace")
        return None, str(detail)


def compile_pattern(pattern: object) -> re2._Regexp[str]:
    """The RE2 expression of a schema's ``pattern`` (or ``patternProperties`` key); raises
    ``PatternRefused`` with a readable reason when RE2 cannot compile it."""
    if not isinstance(pattern, str):
        raise PatternRefused(f"a pattern must be a string, not {type(pattern).__name__}")
    regexp, problem = _compiled(pattern)
    if regexp is None:
        raise PatternRefused(
            f"pattern {_shown(pattern)} cannot be checked in bounded time: {problem} "
            "(RE2 syntax: no backreferences, no lookahead or lookbehind)"
        )
    return regexp


def pattern_problem(pattern: object) -> str | None:
    """Why ``compile_pattern`` refuses ``pattern``, or None."""
    try:
        compile_pattern(pattern)
    except PatternRefused as exc:
        return str(exc)
    return None


def schema_problem(schema: Any) -> str | None:
    """The first reason ``schema`` cannot be checked with RE2 in bounded time, or None: it is
    nested deeper than ``MAX_SCHEMA_DEPTH``, a ``pattern`` or a ``patternProperties`` key that
    RE2 refuses, or ``unevaluatedProperties`` in a schema that has ``patternProperties``.

    Walks the schema iteratively (any depth), skipping data (``const``, ``enum``, ``default``,
    ``examples``) and reading the keys under ``properties`` and ``$defs`` as names: a property
    named ``pattern`` is not a pattern. Anything else that looks like a keyword is taken as one
    (refusing too much is safe; running an unchecked expression is not).
    """
    walk = _Walk(stack=[(schema, 1)])
    while walk.stack:
        node, depth = walk.stack.pop()
        problem = _node_problem(walk, node, depth)
        if problem:
            return problem
    if walk.unevaluated and walk.pattern_properties:
        return (
            "it uses unevaluatedProperties together with patternProperties, which cannot be "
            "checked in bounded time"
        )
    return None


@dataclass
class _Walk:
    """``schema_problem``'s walk: the nodes still to read (with their depth), and what it has
    seen of the keywords that cannot be combined."""

    stack: list[tuple[Any, int]]
    unevaluated: bool = False
    pattern_properties: bool = False


def _node_problem(walk: _Walk, node: Any, depth: int) -> str | None:
    """Read one node: a list's items and an object's keywords are pushed for later."""
    if not isinstance(node, Mapping | list):
        return None
    if depth > MAX_SCHEMA_DEPTH:
        return f"it is nested deeper than {MAX_SCHEMA_DEPTH} levels"
    if isinstance(node, list):
        walk.stack.extend((item, depth + 1) for item in node)
        return None
    for key, value in node.items():
        problem = _keyword_problem(walk, key, value, depth)
        if problem:
            return problem
    return None


def _keyword_problem(walk: _Walk, key: Any, value: Any, depth: int) -> str | None:
    if key in _DATA_KEYWORDS:
        return None
    if key == "pattern" and not isinstance(value, Mapping | list):
        return pattern_problem(value)
    if key == "patternProperties" and isinstance(value, Mapping):
        walk.pattern_properties = True
        for expression, subschema in value.items():
            problem = pattern_problem(expression)
            if problem:
                return problem
            walk.stack.append((subschema, depth + 2))
        return None
    if key in _NAMED_SUBSCHEMAS and isinstance(value, Mapping):
        walk.stack.extend((subschema, depth + 2) for subschema in value.values())
        return None
    walk.unevaluated = walk.unevaluated or key == "unevaluatedProperties"
    if isinstance(value, Mapping | list):
        walk.stack.append((value, depth + 1))
    return None


# --- The keywords, with RE2 ----------------------------------------------------------------


def _value(text: str) -> str:
    """A string as a message quotes it: whole when short, else its start and its length (so
    the pattern after it is never cut off)."""
    if len(text) <= MAX_SHOWN_PATTERN_CHARS:
        return repr(text)
    return f"{text[: MAX_SHOWN_PATTERN_CHARS - 1] + '…'!r} ({len(text)} characters)"


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(compile_pattern(pattern), instance):
        yield ValidationError(f"{_value(instance)} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regexp = compile_pattern(pattern)
        for key, value in instance.items():
            if _search(regexp, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _extras(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The keys of ``instance`` that neither ``properties`` nor ``patternProperties`` cover."""
    properties = schema.get("properties", {})
    regexps = [compile_pattern(p) for p in schema.get("patternProperties", {})]
    return [
        key
        for key in instance
        if key not in properties and not any(_search(regexp, key) for regexp in regexps)
    ]


def _listed(extras: list[str]) -> tuple[str, str]:
    return ", ".join(_value(extra) for extra in extras), "was" if len(extras) == 1 else "were"


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's ``additionalProperties``, its messages included, matching with RE2."""
    if not validator.is_type(instance, "object"):
        return
    extras = sorted(set(_extras(instance, schema)), key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(_value(extra) for extra in extras)
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            listed, verb = _listed(extras)
            yield ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}
_BOUNDED: dict[type[Validator], type[Validator]] = {}


def bounded_validator(draft: type[Validator]) -> type[Validator]:
    """``draft``'s validator class with every keyword that runs a schema's regular expression
    replaced by its RE2 version (a keyword the draft does not have is not added)."""
    found = _BOUNDED.get(draft)
    if found is None:
        replaced = {k: v for k, v in _KEYWORDS.items() if k in draft.VALIDATORS}
        found = _BOUNDED[draft] = extend(draft, validators=replaced)
    return found


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


def format_checker(base: FormatChecker) -> FormatChecker:
    """``base``'s formats with ``regex`` checked by RE2 (``PatternRefused``): for checking a
    schema against its metaschema, where every ``pattern`` is a ``regex``."""
    checker = FormatChecker(formats=())
    checker.checkers = {**base.checkers, "regex": (_is_regex, PatternRefused)}
    return checker
