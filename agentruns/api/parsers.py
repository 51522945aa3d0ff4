"""The API's JSON parser: JSON that PostgreSQL (and every consumer) can store and read back.

Python's ``json`` accepts escapes that are not text: a lone surrogate (``"\\ud800"``) cannot be
encoded as UTF-8, and PostgreSQL's ``jsonb`` refuses ``\\u0000``. Either would reach the database
and fail there (a 500). They are refused here, with a typed 400, before anything runs.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 100  # nesting beyond this is refused before it can exhaust the stack


def _check(value: Any, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ParseError("JSON strings may not contain the NUL character (\\u0000)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ParseError(
                "JSON strings must be valid Unicode (a lone surrogate was sent)"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


class StrictJSONParser(JSONParser):
    """``JSONParser`` that refuses what cannot be stored: lone surrogates, NUL, deep nesting."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        _check(data)
        return data
