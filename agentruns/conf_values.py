"""How one ``AGENTRUNS`` value is parsed into its type, and what may be wrong with it.

Each parser takes the setting's name and the raw value (a project's Python value, or the text of an
``AGENTRUNS_<NAME>`` variable) and returns the typed value or raises ``Invalid`` with the system
check id (``Problem``) and a message that names the variable. ``agentruns.conf`` says which parser
reads which name. Must not import Django models or the host project: settings modules import
``agentruns.conf``, which imports this one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from agentruns.outbound import allowlist_entry_problem

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
ENV_PREFIX_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the ``AGENTRUNS`` setting. ``id`` is the system check's without the
    ``agentruns.`` prefix: ``E…`` an error ``app_settings()`` refuses, ``W…`` a warning it lets
    through (the value is ignored or kept as documented)."""

    id: str
    name: str
    message: str
    hint: str = ""

    @property
    def is_error(self) -> bool:
        return self.id.startswith("E")


# The ids, each with what it means (README "Checking the settings").
NOT_A_DICT = "E001"  # AGENTRUNS is not a dict
WRONG_TYPE = "E002"  # a value that does not parse as its type
OUT_OF_RANGE = "E003"  # a value outside its range (or empty where it may not be)
BAD_ALLOWLIST_ENTRY = "E004"  # a WEBHOOK_ALLOWLIST entry that is not host, host:port, IP, [v6]:port
BAD_SECRET_PREFIX = "E005"  # a SECRET_ENV_PREFIXES entry that no variable name can start with
UNKNOWN_NAME = "W001"  # a name AGENTRUNS does not know (likely a typo): ignored
EMPTY_SECRET_PREFIX = "W002"  # an empty SECRET_ENV_PREFIXES entry: ignored, never a wildcard


class Invalid(Exception):
    def __init__(self, id: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.id = id
        self.message = message
        self.hint = hint


Parser = Callable[[str, Any], Any]


SECRET_NAMES = frozenset({"METRICS_TOKEN"})  # never shown in a message, whatever it holds
SHOWN_CHARS = 80


def shown(name: str, raw: Any) -> str:
    """``AGENTRUNS_<NAME>=<value>`` for a message: a secret's type only, a long value cut."""
    if name in SECRET_NAMES:
        return f"AGENTRUNS_{name}=<{type(raw).__name__}, not shown>"
    text = repr(raw)
    return f"AGENTRUNS_{name}={text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + '…'}"


def parse_integer(minimum: int) -> Parser:
    def parse(name: str, raw: Any) -> int:
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, float) and raw.is_integer():
            value = int(raw)
        elif isinstance(raw, str):
            try:
                value = int(raw.strip())
            except ValueError:
                value = None
        if value is None:
            raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not an integer")
        if value < minimum:
            raise Invalid(OUT_OF_RANGE, f"{shown(name, raw)} must be {minimum} or more")
        return value

    return parse


def parse_seconds(*, zero: bool) -> Parser:
    """A number of seconds (fractions allowed), above 0 (or 0 and more when ``zero``)."""

    def parse(name: str, raw: Any) -> float:
        value: float | None = None
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            value = float(raw)
        elif isinstance(raw, str):
            try:
                value = float(raw.strip())
            except ValueError:
                value = None
        if value is None or not math.isfinite(value):
            raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a number of seconds")
        if value < 0 or (value == 0 and not zero):
            bound = "0 or more" if zero else "more than 0"
            raise Invalid(OUT_OF_RANGE, f"{shown(name, raw)} must be {bound}")
        return value

    return parse


def parse_boolean(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return raw.strip().lower() in TRUE_WORDS
    raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a boolean (True/False, on/off)")


def parse_text(name: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a string")
    return raw


def parse_currency(name: str, raw: Any) -> str:
    text = parse_text(name, raw).strip()
    if not text:
        raise Invalid(OUT_OF_RANGE, f"{shown(name, raw)} may not be empty", "e.g. USD or EUR")
    return text


def parse_site_url(name: str, raw: Any) -> str:
    text = parse_text(name, raw).strip()
    if text:
        parts = urlsplit(text)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise Invalid(
                OUT_OF_RANGE,
                f"{shown(name, raw)} is not an http(s) URL",
                "e.g. https://leasehold.example, or empty for links that are paths only",
            )
    return text


def parse_names(name: str, raw: Any) -> tuple[str, ...]:
    """A list (or tuple) of strings, or one comma-separated string; blank entries dropped."""
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list | tuple) or not all(isinstance(item, str) for item in raw):
        raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a list of strings")
    return tuple(item.strip() for item in raw if item.strip())


def parse_allowlist(name: str, raw: Any) -> tuple[str, ...]:
    entries = parse_names(name, raw)
    for entry in entries:
        problem = allowlist_entry_problem(entry)
        if problem is not None:
            raise Invalid(
                BAD_ALLOWLIST_ENTRY,
                f"AGENTRUNS_{name}: {entry!r} {problem}",
                "each entry is host, host:port, an IP address or [IPv6]:port (no scheme, no path)",
            )
    return entries


def parse_prefixes(name: str, raw: Any) -> tuple[str, ...]:
    prefixes = parse_names(name, raw)
    for prefix in prefixes:
        if not ENV_PREFIX_RE.fullmatch(prefix):
            raise Invalid(
                BAD_SECRET_PREFIX,
                f"AGENTRUNS_{name}: no environment variable name starts with {prefix!r}",
                "a prefix is letters, digits and _, not starting with a digit (e.g. LEASEHOLD_)",
            )
    return prefixes


def parse_budget(name: str, raw: Any) -> Decimal | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int | float | Decimal):
        raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a decimal")
    try:
        value = Decimal(str(raw).strip())
    except InvalidOperation:
        raise Invalid(WRONG_TYPE, f"{shown(name, raw)} is not a decimal") from None
    if not value.is_finite() or value < 0:
        raise Invalid(OUT_OF_RANGE, f"{shown(name, raw)} must be a decimal of 0 or more")
    return value
