"""What a tool returned is made storable before anything of it is written (docs/design.md §4.1):
mended and marked (``storable.mend_json``), never refused — the call has run. A value JSON
cannot hold at all, or one whose own code raises while it is read, is an error result that
says the tool ran; nothing here raises. No database: the run-level tests are in
tests/agentruns/services/runtime/test_tool_step_hostile_results.py.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentruns.models import Effect
from agentruns.storable import (
    DEPTH,
    NUMBER,
    REPLACEMENT,
    SIZE,
    TEXT,
    NotJson,
    json_problem,
    mend_json,
)
from agentruns.tools import Tool, ToolContext, invoke_tool
from agentruns.tools.invocation import MAX_RESULT_CHARS, MAX_RESULT_DEPTH, stored_result
from agentruns.tools.mcp_wire import mend_line
from agentruns.tools.registry import OutcomeUnknown, RemoteToolError

R = REPLACEMENT


def context() -> ToolContext:
    return ToolContext(
        run_uuid=uuid.uuid4(), call_id="call-1", initiator_id=None, fencing_token=1,
        timeout_seconds=1.0,
    )  # fmt: skip


def returning(value: Any) -> Tool:
    return Tool(
        name="hostile",
        description="Returns what the test gives it.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.READ,
        func=lambda ctx, arguments: value,
    )


def raising(exc: BaseException) -> Tool:
    def body(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        raise exc

    return Tool(
        name="hostile",
        description="Raises what the test gives it.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.READ,
        func=body,
    )


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
    return depth - 1


def stored(value: Any) -> Any:
    """``value`` as a database gives it back (JSON text both ways; refuses NaN like jsonb)."""
    return json.loads(json.dumps(value, allow_nan=False))


# --- mended, and marked ------------------------------------------------------------------------

MENDED: dict[str, tuple[Any, Any, tuple[str, ...]]] = {
    "nul": ({"text": "a\x00b"}, {"text": f"a{R}b"}, (TEXT,)),
    "surrogate": ({"text": ["a\ud800b", "\udfff"]}, {"text": [f"a{R}b", R]}, (TEXT,)),
    "key": ({"k\x00": 1}, {f"k{R}": 1}, (TEXT,)),
    "nan": ({"n": math.nan}, {"n": "NaN"}, (NUMBER,)),
    "infinity": ([math.inf, -math.inf, 1.5], ["Infinity", "-Infinity", 1.5], (NUMBER,)),
    "nan-key": ({math.nan: 1, 2: 2, None: 3}, {"NaN": 1, "2": 2, "null": 3}, (NUMBER,)),
    "both": ({"t": "\x00", "n": math.nan}, {"t": R, "n": "NaN"}, (TEXT, NUMBER)),
    "long-int": (
        10**5000,
        "an integer of 16,610 bits (too long to write)",
        (NUMBER,),
    ),
    "top-level-text": ("\x00", R, (TEXT,)),
}


@pytest.mark.parametrize("case", list(MENDED))
def test_a_result_that_cannot_be_stored_is_mended_and_marked(case: str) -> None:
    returned, expected, marks = MENDED[case]

    result = invoke_tool(returning(returned), {}, context())

    assert (result.ok, result.content, result.normalised) == (True, expected, marks)
    assert json_problem(result.content) is None
    assert stored(result.content) == result.content
    # The model reads exactly what is stored.
    assert json.loads(result.as_message_content()) == result.content


def test_a_clean_result_is_its_json_round_trip_and_unmarked() -> None:
    returned = {"t": (1, 2), 3: "three", "s": "é ✓ 😀", "f": 1e308, "n": None, "b": False}

    result = invoke_tool(returning(returned), {}, context())

    assert result.content == {
        "t": [1, 2],
        "3": "three",
        "s": "é ✓ 😀",
        "f": 1e308,
        "n": None,
        "b": False,
    }
    assert result.normalised == ()


def test_nesting_past_the_bound_is_cut_with_a_note() -> None:
    result = invoke_tool(returning({"deep": nested(MAX_RESULT_DEPTH + 50)}), {}, context())

    assert result.ok and result.normalised == (DEPTH,)
    assert depth_of(result.content) == MAX_RESULT_DEPTH
    assert f"[cut: nested deeper than {MAX_RESULT_DEPTH} levels]" in json.dumps(result.content)
    # At the bound itself nothing is cut.
    at_bound = invoke_tool(returning(nested(MAX_RESULT_DEPTH)), {}, context())
    assert (at_bound.content, at_bound.normalised) == (nested(MAX_RESULT_DEPTH), ())


def test_nesting_past_the_stack_is_cut_not_a_crash() -> None:
    result = invoke_tool(returning(nested(200_000)), {}, context())

    assert result.ok and result.normalised == (DEPTH,)
    assert depth_of(result.content) == MAX_RESULT_DEPTH


@pytest.mark.parametrize(
    "returned",
    [
        {"text": "x" * (MAX_RESULT_CHARS + 10)},
        list(range(MAX_RESULT_CHARS // 2)),
        {"quotes": '"\\' * MAX_RESULT_CHARS},  # its JSON twice as long as the text
    ],
    ids=["long-text", "many-values", "escapes"],
)
def test_a_result_past_the_size_bound_is_cut_to_its_beginning_with_a_note(returned: Any) -> None:
    written = json.dumps(returned, separators=(",", ":"), ensure_ascii=False)

    result = invoke_tool(returning(returned), {}, context())

    assert result.ok and result.normalised == (SIZE,)
    assert isinstance(result.content, str)
    head, note = result.content.split(" … [cut for storage: ")
    assert written.startswith(head) and len(head) > MAX_RESULT_CHARS // 3
    assert note == f"{len(written):,} characters of JSON; the beginning is kept]"
    assert len(json.dumps(result.content, ensure_ascii=False)) <= MAX_RESULT_CHARS


def test_a_structure_sharing_parts_exponentially_is_cut_in_bounded_time() -> None:
    shared: Any = [1]
    for _ in range(200):  # 2**200 values once written out
        shared = [shared, shared]

    mended = mend_json(shared, max_chars=10_000, max_depth=1_000)

    assert mended.normalised == (SIZE,)
    assert mended.value.endswith(
        "[cut for storage: more than 10,000 characters of JSON; the beginning is kept]"
    )


def test_a_shared_part_that_is_not_circular_is_kept() -> None:
    part = [1, {"x": 2}]
    assert invoke_tool(returning({"a": part, "b": part}), {}, context()).content == {
        "a": [1, {"x": 2}],
        "b": [1, {"x": 2}],
    }


# --- not JSON at all: an error result saying the tool ran ---------------------------------------


class Exploding:
    """A hostile value: its own code raises when it is read."""

    def __str__(self) -> str:
        raise RuntimeError("no")


class ExplodingDict(dict):
    def items(self):  # type: ignore[override]
        raise RuntimeError("no items for you")


def circular() -> Any:
    loop: list[Any] = [1]
    loop.append({"again": loop})
    return loop


NOT_JSON: dict[str, tuple[Any, str]] = {
    "object": (Exploding(), "a value of type 'Exploding' at $"),
    "bytes": ({"data": b"\x00\xff"}, "a value of type 'bytes' at $.data"),
    "set": ([{1, 2}], "a value of type 'set' at $[0]"),
    "tuple-key": ({(1, 2): "x"}, "a key of type 'tuple' at $"),
    "circular": (circular(), "a structure inside itself at $[1].again"),
    "raises-when-read": (
        # json.dumps reads a dict subclass through the C API; the walk calls its items().
        {"x": [math.nan, ExplodingDict(a=1)]},
        "reading it raised RuntimeError",
    ),
}


@pytest.mark.parametrize("case", list(NOT_JSON))
def test_a_value_json_cannot_hold_is_an_error_result_saying_the_tool_ran(case: str) -> None:
    returned, where = NOT_JSON[case]

    result = invoke_tool(returning(returned), {}, context())

    assert result.ok is False and result.content is None and not result.in_doubt
    assert result.error == f"tool 'hostile' ran, but returned what JSON cannot hold: {where}"
    assert json.loads(result.as_message_content()) == {"error": result.error}


# --- error texts --------------------------------------------------------------------------------


class UnreadableMessage(Exception):
    def __str__(self) -> str:
        raise ValueError("hostile __str__")


@pytest.mark.parametrize(
    ("exc", "error", "in_doubt"),
    [
        (RuntimeError("boom \x00 \ud800"), f"RuntimeError: boom {R} {R}", False),
        (RemoteToolError("remote \x00 said no"), f"RemoteToolError: remote {R} said no", False),
        (
            OutcomeUnknown("lost \udc80 after sending"),
            f"outcome unknown: lost {R} after sending",
            True,
        ),
        (
            UnreadableMessage(),
            "UnreadableMessage: (its message could not be read: ValueError)",
            False,
        ),
    ],
    ids=["raised", "remote", "outcome-unknown", "unreadable-message"],
)
def test_an_error_text_is_mended_and_marked(exc: Exception, error: str, in_doubt: bool) -> None:
    result = invoke_tool(raising(exc), {}, context())

    assert (result.ok, result.error, result.in_doubt) == (False, error, in_doubt)
    expected_marks = ("text",) if R in error else ()
    assert result.normalised == expected_marks


def test_a_long_error_text_is_still_cut_at_its_bound() -> None:
    result = invoke_tool(raising(RuntimeError("\x00" * 10_000)), {}, context())
    assert len(result.error) == 2000 and result.error.endswith("…")
    assert result.normalised == ("text",)


# --- mending is total and settles at once -------------------------------------------------------

_HOSTILE_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]),
    ),
    max_size=20,
)
_KEYS = st.one_of(_HOSTILE_TEXT, st.integers(), st.floats())


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.tuples(children, children),
        st.dictionaries(_KEYS, children, max_size=5),
    )


_HOSTILE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        _HOSTILE_TEXT,
    ),
    _containers,
    max_leaves=60,
)


@settings(max_examples=200, deadline=None)
@given(_HOSTILE, st.integers(min_value=1, max_value=8), st.integers(min_value=300, max_value=3000))
def test_any_json_like_value_is_mended_into_storable_json_that_mends_to_itself(
    value: Any, max_depth: int, max_chars: int
) -> None:
    mended = mend_json(value, max_chars=max_chars, max_depth=max_depth)

    assert json_problem(mended.value, max_depth=max_depth) is None
    assert len(json.dumps(mended.value, separators=(",", ":"), ensure_ascii=False)) <= max_chars
    assert stored(mended.value) == mended.value
    again = mend_json(mended.value, max_chars=max_chars, max_depth=max_depth)
    assert (again.value, again.normalised) == (mended.value, ())
    if not mended.normalised:  # unmarked: exactly the JSON round trip
        assert mended.value == json.loads(json.dumps(value))


def test_stored_result_never_raises_for_the_tool_s_sake() -> None:
    with pytest.raises(NotJson):
        mend_json(object(), max_chars=100)
    assert stored_result("t", object()).ok is False


# --- an MCP answer over HTTP: lone surrogates' escapes rewritten before the SDK parses it -------


@pytest.mark.parametrize(
    ("wire", "mended", "count"),
    [
        (rb'{"a":"x\ud800y"}', rb'{"a":"x\ufffdy"}', 1),
        (rb'["\udc00\ud800"]', rb'["\ufffd\ufffd"]', 2),
        (rb'["\ud800\ud800\udc00"]', rb'["\ufffd\ud800\udc00"]', 1),  # then a valid pair
        (rb'["\ud83d\ude00", "\uD83D\uDE00"]', rb'["\ud83d\ude00", "\uD83D\uDE00"]', 0),
        (rb'["\\ud800"]', rb'["\\ud800"]', 0),  # an escaped backslash, then the letters "ud800"
        (rb'["\\\ud800"]', rb'["\\\ufffd"]', 1),  # an escaped backslash, then an escape
        (rb'["\u0041"]', rb'["\u0041"]', 0),
    ],
)
def test_the_http_transport_rewrites_exactly_the_lone_surrogate_escapes(
    wire: bytes, mended: bytes, count: int
) -> None:
    assert mend_line(wire) == (mended, count)
    assert len(mended) == len(wire)  # the body's length does not change
    json.loads(mended.decode())  # and it is still JSON
