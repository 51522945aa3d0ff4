"""``check_reply`` and ``agentruns.storable``: what a provider's reply may hold before anything of
it is stored, and what is mended (free text) or refused (anything inside a tool call)."""

from __future__ import annotations

import json
import math

import pytest

from agentruns.providers.base import ErrorKind, ProviderError, ProviderReply, ToolCall
from agentruns.providers.replies import (
    MAX_ARGUMENT_DEPTH,
    MAX_ARGUMENTS_CHARS,
    MAX_CALL_TOKENS,
    MAX_CONTENT_CHARS,
    MAX_ID_CHARS,
    MAX_MODEL_CHARS,
    MAX_NAME_CHARS,
    MAX_TOKENS,
    MAX_TOOL_CALLS,
    check_reply,
)
from agentruns.storable import REPLACEMENT, json_problem, storable_text, text_problem


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def reply(*calls: ToolCall, content: str = "", usage=None, model: str = "m") -> ProviderReply:
    return ProviderReply(
        content=content,
        tool_calls=list(calls),
        usage={"prompt_tokens": 3, "completion_tokens": 4} if usage is None else usage,
        model=model,
    )


def refused(candidate: ProviderReply, **kwargs) -> str:
    with pytest.raises(ProviderError) as caught:
        check_reply(candidate, **kwargs)
    assert (caught.value.kind, caught.value.retryable) == (ErrorKind.BAD_RESPONSE, False)
    message = str(caught.value)
    assert text_problem(message) is None  # the refusal itself can always be stored
    return message


# --- storable --------------------------------------------------------------------------------


def test_text_that_a_column_refuses_is_named_and_replaced_one_for_one():
    assert text_problem("plain é 😀") is None
    assert "NUL" in text_problem("a\x00b")
    assert "lone surrogate" in text_problem("a\ud800b")
    assert storable_text("a\x00b\ud800c\udfff") == f"a{REPLACEMENT}b{REPLACEMENT}c{REPLACEMENT}"
    clean = "nothing to mend"
    assert storable_text(clean) is clean


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, {"b": "x\x00"}]}, "$.a[1].b holds the NUL character"),
        ({"a b": "\udc80"}, "$['a b'] holds a lone surrogate"),
        ({"k\x00": 1}, "has a key holding the NUL character"),
        ([math.nan], "$[0] is not a finite number (nan"),
        ({"x": -math.inf}, "$.x is not a finite number (-inf"),
        ({1: "int key"}, "has a key that is not a string"),
        ({"x": object()}, "is not a JSON value (object)"),
    ],
)
def test_json_that_cannot_be_stored_is_refused_naming_where(value, problem):
    assert problem in json_problem(value)


def test_nesting_is_refused_at_the_limit_without_exhausting_the_stack():
    assert json_problem(nested(10), max_depth=10) is None
    assert json_problem(nested(11), max_depth=10) == "JSON nested deeper than 10 levels"
    assert "nested deeper" in json_problem(nested(100_000))  # iterative: no RecursionError
    assert json_problem({"big": 10**400, "ok": [1.5, True, None, ""]}) is None


# --- check_reply: refused --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"value": "a\x00b"}, "$.value holds the NUL character"),
        ({"value": "a\ud800b"}, "$.value holds a lone surrogate"),
        ({"value": math.nan}, "$.value is not a finite number (nan"),
        ({"value": math.inf}, "$.value is not a finite number (inf"),
        ({"n": [1, -math.inf]}, "$.n[1] is not a finite number (-inf"),
        ({"bad\x00key": 1}, "has a key holding the NUL character"),
        (nested(MAX_ARGUMENT_DEPTH + 1), f"nested deeper than {MAX_ARGUMENT_DEPTH}"),
        ({"_unparsed_arguments": "{oops\x00"}, "$._unparsed_arguments holds the NUL"),
    ],
    ids=["nul", "surrogate", "nan", "inf", "minus-inf", "key", "deep", "unparsed-nul"],
)
def test_arguments_that_cannot_be_stored_are_refused_never_mended(arguments, problem):
    message = refused(reply(ToolCall(id="c1", name="create_note", arguments=arguments)))

    assert "tool call 1 ('create_note') has arguments that cannot be stored as sent" in message
    assert problem in message


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (ToolCall(id="c\x00", name="t", arguments={}), "its id holds the NUL"),
        (ToolCall(id="c", name="t\ud800", arguments={}), "its name holds a lone surrogate"),
        (ToolCall(id="c" * (MAX_ID_CHARS + 1), name="t", arguments={}), "characters long; at most"),
        (
            ToolCall(id="c", name="t" * (MAX_NAME_CHARS + 1), arguments={}),
            "characters long; at most",
        ),
        (ToolCall(id=7, name="t", arguments={}), "its id is a int"),  # type: ignore[arg-type]
        (ToolCall(id="c", name=None, arguments={}), "its name is a NoneType"),  # type: ignore[arg-type]
        (ToolCall(id="c", name="t", arguments=["x"]), "arguments that are not a JSON object"),  # type: ignore[arg-type]
    ],
    ids=["id-nul", "name-surrogate", "id-long", "name-long", "id-int", "name-none", "args-list"],
)
def test_a_call_whose_id_or_name_cannot_be_stored_is_refused(call, problem):
    assert problem in refused(reply(call))


def test_too_many_calls_or_too_much_argument_text_is_refused():
    many = [ToolCall(id=f"c{n}", name="t", arguments={}) for n in range(MAX_TOOL_CALLS + 1)]
    assert f"at most {MAX_TOOL_CALLS} are taken" in refused(reply(*many))

    half = "x" * (MAX_ARGUMENTS_CHARS // 2)
    calls = [ToolCall(id=f"c{n}", name="t", arguments={"v": half}) for n in range(2)]
    assert "(at tool call 2)" in refused(reply(*calls))


def test_content_that_is_not_text_or_is_huge_is_refused():
    assert "content is a list, not text" in refused(reply(content=[{"type": "text"}]))  # type: ignore[arg-type]
    assert f"at most {MAX_CONTENT_CHARS}" in refused(reply(content="x" * (MAX_CONTENT_CHARS + 1)))


@pytest.mark.parametrize(
    "value", [-1, 1.5, True, "12", math.nan, math.inf, MAX_CALL_TOKENS + 1, 2**31, 10**20]
)
def test_a_token_count_that_is_not_a_count_is_refused(value):
    message = refused(reply(usage={"prompt_tokens": value, "completion_tokens": 1}))

    assert "prompt_tokens=" in message


def test_tokens_that_would_overflow_the_run_s_totals_are_refused():
    usage = {"prompt_tokens": MAX_CALL_TOKENS, "completion_tokens": MAX_CALL_TOKENS}
    fits = MAX_TOKENS - 2 * MAX_CALL_TOKENS

    assert check_reply(reply(usage=usage), tokens_so_far=fits).usage == usage
    message = refused(reply(usage=usage), tokens_so_far=fits + 1)
    assert f"would take the run's total past {MAX_TOKENS}" in message


# --- check_reply: normalised -----------------------------------------------------------------


def test_free_text_is_mended_and_the_reply_says_so():
    checked = check_reply(reply(content="a\x00b\ud800", model="gpt\x00" + "x" * 500))

    assert checked.content == f"a{REPLACEMENT}b{REPLACEMENT}"
    assert checked.model == f"gpt{REPLACEMENT}" + "x" * (MAX_MODEL_CHARS - 4)
    assert checked.normalised == ("content", "model")
    json.dumps(checked.content).encode("utf-8")  # storable


def test_usage_keeps_the_three_counts_and_reads_an_integral_float_as_an_integer():
    checked = check_reply(
        reply(usage={"prompt_tokens": 11.0, "completion_tokens": 2, "cached\x00": 5})
    )

    assert checked.usage == {"prompt_tokens": 11, "completion_tokens": 2}
    assert type(checked.usage["prompt_tokens"]) is int
    assert checked.normalised == ()


def test_a_clean_reply_is_returned_as_it_is():
    clean = reply(
        ToolCall(id="c1", name="create_note", arguments={"title": "é 😀", "n": 1e300}),
        content="fine",
        usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    )

    assert check_reply(clean) is clean
