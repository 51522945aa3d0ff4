"""What the database can store: text and JSON that PostgreSQL and SQLite both accept, and
read back equal.

Python holds values no column takes: ``"\\x00"`` (PostgreSQL's ``text`` and ``jsonb`` refuse
NUL), a lone surrogate such as ``"\\ud800"`` (not encodable as UTF-8), and ``nan`` / ``inf``
(``json`` writes them as ``NaN`` / ``Infinity``, which is not JSON: ``jsonb`` and SQLite's
``JSON_VALID`` check refuse it). Python's ``json`` parses all of them, and ``1e999`` as ``inf``.
Every value that comes from outside (a request, a form, a provider's reply) is checked here
before anything stores it: ``json_problem`` says what is wrong in words a person can read,
``storable_text`` replaces what cannot be stored in free text.

Free of Django: the API parser, forms, models' ``clean`` and the providers all use it.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: What ``storable_text`` puts in place of a character no column can store (U+FFFD).
REPLACEMENT = "\ufffd"

#: Nesting beyond this is refused (the API's parser, forms, provider replies): deeper values
#: exhaust the stack of whatever walks them next (the digest, the schema check, the database).
MAX_DEPTH = 100

NUL = "\x00"


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (``None``: it can): a NUL character or a lone surrogate."""
    if NUL in text:
        return "the NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (not valid Unicode)"
    return None


def storable_text(text: str) -> str:
    """``text`` with every NUL character and every lone surrogate replaced by ``REPLACEMENT``
    (one for one); ``text`` itself when there is none."""
    if text_problem(text) is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def shown(value: Any, limit: int = 60) -> str:
    """``value`` written for a message (``ascii``: text quoted, every character a column
    refuses or a terminal would act on escaped), cut at ``limit`` characters. Always
    storable."""
    quoted = ascii(value)
    return quoted if len(quoted) <= limit else quoted[: limit - 1] + "…"


def _where(path: tuple[Any, ...]) -> str:
    if not path:
        return "the value"
    return "$" + "".join(_step(key) for key in path)


def _step(key: Any) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    if key.isascii() and key.isidentifier() and len(key) <= 40:
        return f".{key}"
    return f"[{shown(key, 40)}]"


def json_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``value`` (parsed JSON) cannot be stored, naming where; ``None`` when it can.

    Refused: strings (values or keys) holding NUL or a lone surrogate, numbers that are not
    finite (``NaN``, ``Infinity``, ``1e999``), keys that are not strings, nesting deeper than
    ``max_depth``, and anything that is not a JSON type (dict, list, str, int, float, bool,
    ``None``). Walks iteratively: a value nested past the stack is reported, never a crash.
    """
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > max_depth:
            return f"JSON nested deeper than {max_depth} levels"
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return f"{_where(path)} holds {problem}"
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                return (
                    f"{_where(path)} is not a finite number ({item!r}: NaN, Infinity and "
                    "numbers past ±1.8e308 such as 1e999 cannot be stored)"
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{_where(path)} has a key that is not a string ({shown(key, 40)})"
                problem = text_problem(key)
                if problem is not None:
                    return f"{_where(path)} has a key holding {problem}"
                stack.append((child, (*path, key)))
        elif isinstance(item, list | tuple):
            stack.extend((child, (*path, index)) for index, child in enumerate(item))
        else:
            return f"{_where(path)} is not a JSON value ({type(item).__name__})"
    return None
