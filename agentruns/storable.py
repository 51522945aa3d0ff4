"""What the database can store: text and JSON that PostgreSQL and SQLite both accept, and
read back equal.

Python holds values no column takes: ``"\\x00"`` (PostgreSQL's ``text`` and ``jsonb`` refuse
NUL), a lone surrogate such as ``"\\ud800"`` (not encodable as UTF-8), and ``nan`` / ``inf``
(``json`` writes them as ``NaN`` / ``Infinity``, which is not JSON: ``jsonb`` and SQLite's
``JSON_VALID`` check refuse it). Python's ``json`` parses all of them, and ``1e999`` as ``inf``.
Every value that comes from outside (a request, a form, a provider's reply) is checked here
before anything stores it: ``json_problem`` says what is wrong in words a person can read,
``storable_text`` replaces what cannot be stored in free text. A value that reports something
that already happened (a tool's result, a preview, a check's answer) is mended instead of
refused: ``mend_json`` returns it storable and names what it changed.

Free of Django: the API parser, forms, models' ``clean`` and the providers all use it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
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


# --- Mending: what came back from something that already happened ------------------------------

#: The kinds of change ``mend_json`` makes, as an event's ``normalised`` names them.
TEXT = "text"  # NUL or a lone surrogate replaced by U+FFFD (in a value or a key)
NUMBER = "number"  # NaN / ±Infinity written as a string; an integer too long to write, likewise
DEPTH = "depth"  # nesting past the bound replaced by a string saying so
SIZE = "size"  # JSON past the bound replaced by a string holding its beginning
#: Every kind, in the order a ``normalised`` list names them.
KINDS = (TEXT, NUMBER, DEPTH, SIZE)
#: What a number that is not finite is written as (the JSON text a server would have sent).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
#: Above this many bits an integer may pass Python's limit on decimal digits (4,300); it is
#: written only if ``repr`` takes it.
_LONG_INT_BITS = 14_000

_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = frozenset({str, int, float, bool, type(None)})


class NotJson(ValueError):
    """A value ``mend_json`` cannot turn into JSON: a type JSON has no place for (bytes, a set,
    an object), a key that is not text or a number, or a structure that contains itself. The
    message names what and where: ``a value of type 'bytes' at $.a[0]``."""


@dataclass(frozen=True)
class Mended:
    """A value as it may be stored, and what was changed to make it so (``TEXT``, ``NUMBER``,
    ``DEPTH``, ``SIZE``, in that order; empty: nothing)."""

    value: Any
    normalised: tuple[str, ...] = ()


def mend_json(value: Any, *, max_chars: int, max_depth: int = MAX_DEPTH) -> Mended:
    """``value`` as JSON every column stores, mended rather than refused: it reports something
    that already happened (a tool's result), so it is kept as nearly as it can be and marked.

    Strings and keys: NUL and lone surrogates become U+FFFD (``TEXT``). Numbers that are not
    finite become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, and an integer too
    long to write becomes a string saying so (``NUMBER``). A non-empty container at depth
    ``max_depth`` becomes the string ``"[cut: nested deeper than N levels]"`` (``DEPTH``). When
    the compact JSON of the result is longer than ``max_chars``, the result becomes one string:
    the beginning of that JSON and a note saying how long it was (``SIZE``; its own JSON fits).
    Otherwise it is what a JSON round trip gives: tuples as lists, number and boolean keys as
    strings. Mending twice changes nothing more.

    Raises ``NotJson`` for a value JSON cannot hold at all. Walks iteratively, and stops after
    ``max_chars`` values (each takes at least one character of JSON): neither nesting nor a
    structure sharing parts exponentially can exhaust the stack or the time.
    """
    if _bounded(value, max_depth, max_chars):
        # The common case, at C speed: a round trip through JSON text that shows no problem.
        # Only after ``_bounded``: shared parts are written out each time they are met.
        try:
            text: str | None = _COMPACT(value)
        except (TypeError, ValueError, RecursionError):
            text = None
        if (
            text is not None
            and len(text) <= max_chars
            and "\\u0000" not in text
            and _SURROGATE.search(text) is None
        ):
            return Mended(json.loads(text))
    marks: set[str] = set()
    walked, complete = _mend_walk(value, max_depth, max_chars, marks)
    text = _COMPACT(walked)
    if not complete or len(text) > max_chars:
        marks.add(SIZE)
        walked = _cut_json(text, max_chars, complete=complete)
    return Mended(walked, tuple(kind for kind in KINDS if kind in marks))


def _bounded(value: Any, max_depth: int, limit: int) -> bool:
    """Whether ``value`` holds at most ``limit`` values in all, none of its containers with
    items at depth ``max_depth`` or deeper: counted, never walked past the limit."""
    if not isinstance(value, dict | list | tuple):
        return True
    stack: list[tuple[Any, int]] = [(value, 0)]
    count = 0
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if not children:
            continue
        if depth >= max_depth:
            return False
        count += len(children)
        if count > limit:
            return False
        if not set(map(type, children)) <= _SCALARS:  # a flat container costs no loop here
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))
    return True


def _cut_json(text: str, max_chars: int, *, complete: bool) -> str:
    size = f"{len(text):,}" if complete else f"more than {max_chars:,}"
    note = f" … [cut for storage: {size} characters of JSON; the beginning is kept]"
    # As a JSON string each character of ``text`` takes one character, or two for ``"`` and
    # ``\\`` (JSON text holds no other character a string escapes): keep the longest beginning
    # whose own JSON, with the note and the quotes, fits.
    room = max(0, max_chars - len(note) - 2)

    def cost(keep: int) -> int:
        head = text[:keep]
        return keep + head.count('"') + head.count("\\")

    low, high = 0, min(len(text), room)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if cost(middle) <= room else (low, middle - 1)
    cut = text[:low] + note
    excess = len(_COMPACT(cut)) - max_chars
    if excess > 0:  # not expected: each character dropped shortens its JSON by one or more
        cut = text[: max(0, low - excess)] + note
    return cut


# A frame of the walk: the value, where its mended form goes (a list to append to, or a dict
# and the key), its depth, and the chain of containers above it (id, key in its parent, chain).
_Chain = tuple[int, Any, Any] | None


def _mend_walk(value: Any, max_depth: int, max_chars: int, marks: set[str]) -> tuple[Any, bool]:
    root: list[Any] = []
    stack: list[tuple[Any, Any, Any, int, _Chain]] = [(value, root, None, 0, None)]
    budget = max_chars
    while stack:
        item, sink, key, depth, chain = stack.pop()
        budget -= 1
        if budget < 0:
            return root[0], False
        is_dict = isinstance(item, dict)
        if is_dict or isinstance(item, list | tuple):
            if depth >= max_depth and item:
                mended: Any = f"[cut: nested deeper than {max_depth} levels]"
                marks.add(DEPTH)
            else:
                link = chain
                while link is not None:
                    if link[0] == id(item):
                        raise NotJson(f"a structure inside itself at {_chain_at(chain, key)}")
                    link = link[2]
                inner: _Chain = (id(item), key, chain)
                if is_dict:
                    mended = {}
                    entries = [(_mend_key(k, chain, key, marks), v) for k, v in item.items()]
                    for child_key, child in reversed(entries):
                        stack.append((child, mended, child_key, depth + 1, inner))
                else:
                    mended = []
                    for index in range(len(item) - 1, -1, -1):
                        stack.append((item[index], mended, index, depth + 1, inner))
        else:
            mended = _mend_scalar(item, chain, key, marks)
        if type(sink) is list:
            sink.append(mended)
        else:
            sink[key] = mended
    return root[0], True


def _mend_scalar(item: Any, chain: _Chain, key: Any, marks: set[str]) -> Any:
    if item is None or item is True or item is False:
        return item
    if isinstance(item, str):
        plain = str.__str__(item)
        cleaned = storable_text(plain)
        if cleaned is not plain:
            marks.add(TEXT)
        return cleaned
    if isinstance(item, int):
        number = int.__index__(item)
        if number.bit_length() > _LONG_INT_BITS:
            try:
                int.__repr__(number)
            except ValueError:
                marks.add(NUMBER)
                return f"an integer of {number.bit_length():,} bits (too long to write)"
        return number
    if isinstance(item, float):
        real = float.__float__(item)
        if math.isfinite(real):
            return real
        marks.add(NUMBER)
        return NON_FINITE[repr(real)]
    raise NotJson(f"a value of type {shown(type(item).__name__, 40)} at {_chain_at(chain, key)}")


def _mend_key(key: Any, chain: _Chain, parent_key: Any, marks: set[str]) -> str:
    if isinstance(key, str):
        return str(_mend_scalar(key, chain, parent_key, marks))
    if key is None or key is True or key is False:
        return json.dumps(key)
    if isinstance(key, int | float):  # as ``json.dumps`` writes it: ``1`` → ``"1"``
        number = _mend_scalar(key, chain, parent_key, marks)
        return number if isinstance(number, str) else json.dumps(number)
    where = _chain_at(chain, parent_key)
    raise NotJson(f"a key of type {shown(type(key).__name__, 40)} at {where}")


def _chain_at(chain: _Chain, key: Any) -> str:
    """Where the value at ``key`` under ``chain`` is, as ``$.a[0].b`` (``$``: the top)."""
    path: list[Any] = []
    link = chain
    if link is not None:
        path.append(key)
    while link is not None and link[2] is not None:
        path.append(link[1])
        link = link[2]
    return _where(tuple(reversed(path))) if path else "$"
