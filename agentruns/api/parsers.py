"""The API's JSON parser: JSON that PostgreSQL (and every consumer) can store and read back.

Python's ``json`` accepts what is not storable JSON: a lone surrogate (``"\\ud800"``) cannot be
encoded as UTF-8, PostgreSQL's ``jsonb`` refuses ``\\u0000``, and ``1e999`` parses as infinity
(``NaN`` and ``Infinity`` themselves are refused by DRF's strict parsing). Any of them would
reach the database and fail there (a 5xx). They are refused here (``agentruns.storable``), with
a typed 400 naming where, before anything runs.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from agentruns.storable import MAX_DEPTH, json_problem


class StrictJSONParser(JSONParser):
    """``JSONParser`` that refuses what cannot be stored: lone surrogates, NUL, numbers that
    are not finite, deep nesting."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        problem = json_problem(data)
        if problem is not None:
            raise ParseError(f"JSON that cannot be stored: {problem}")
        return data
