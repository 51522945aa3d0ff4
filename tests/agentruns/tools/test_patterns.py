"""Bounded argument checks (``agentruns.tools.patterns``, ``agentruns.tools.schemas``): a schema's
regular expressions run on RE2, a pattern RE2 cannot run makes the tool unusable with a readable
reason (at registration and at an MCP sync), and what is checked has a size."""

from __future__ import annotations

import uuid
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from agentruns.models import AgentRunEvent, EventKind, McpServer
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, ToolContext, ToolRegistry, invoke_tool, registry
from agentruns.tools.invocation import argument_errors
from agentruns.tools.patterns import ecma_to_re2, schema_problem
from agentruns.tools.registry import ToolDefinitionError
from agentruns.tools.schemas import (
    MAX_ARGUMENT_DEPTH,
    InvalidSchema,
    SchemaError,
    check_schema,
    input_errors,
    schema_errors,
)
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.support.mcp_server import TicketServer

# Python's ``re`` takes about 2**n steps to say that "a" * n + "!" does not match this.
CATASTROPHIC = "^(a+)+$"
LONG = 10_000


def text_schema(pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": pattern}},
        "required": ["text"],
    }


def read_tool(parameters: dict[str, Any], name: str = "probe") -> Tool:
    return Tool(name, "Test: a read.", parameters, "read", lambda context, arguments: arguments)


def context() -> ToolContext:
    return ToolContext(uuid.uuid4(), "call-1", None, 1, 1.0)


# --- The pathological pattern, on a long input ------------------------------------------------


def test_a_catastrophic_pattern_gives_the_right_answer_on_a_long_input():
    schema = text_schema(CATASTROPHIC)
    check_schema(schema, what="s")  # RE2 runs it: a usable schema
    [error] = schema_errors(schema, {"text": "a" * LONG + "!"})
    assert error.path == ("text",) and "does not match '^(a+)+$'" in error.message
    assert schema_errors(schema, {"text": "a" * LONG}) == []
    # The same through patternProperties and additionalProperties (a key is matched too).
    keyed = {
        "type": "object",
        "patternProperties": {CATASTROPHIC: {"type": "integer"}},
        "additionalProperties": False,
    }
    check_schema(keyed, what="s")
    assert schema_errors(keyed, {"a" * LONG: 1}) == []
    [wrong_type] = schema_errors(keyed, {"a" * LONG: "x"})
    assert wrong_type.path == ("a" * LONG,)
    [extra] = schema_errors(keyed, {"a" * LONG + "!": 1})
    assert extra.path == () and "does not match any of the regexes" in extra.message


@pytest.mark.django_db(transaction=True)
def test_a_remote_tools_catastrophic_pattern_is_checked_before_any_approval(
    mcp_server: TicketServer,
):
    """A real MCP server declares the pattern; the model's 10,000-character argument that breaks
    it is answered as an error at once (never shown for approval, never sent), and the one that
    matches waits for approval."""
    mcp_server.offer("shout", text_schema(CATASTROPHIC))
    McpServer.objects.create(name="tix", url=mcp_server.url)
    call_command("sync_mcp_tools", "--server", "tix", stdout=StringIO())
    shout = registry.get("mcp__tix__shout")
    assert shout is not None

    broken, fine = "a" * LONG + "!", "a" * LONG
    script = [
        {"tool_calls": [{"name": "mcp__tix__shout", "arguments": {"text": broken}}]},
        {"tool_calls": [{"name": "mcp__tix__shout", "arguments": {"text": fine}}]},
        {"content": "shouted"},
    ]
    result = runs.run_start_sync(
        configuration=AgentConfigurationFactory(script=script), prompt="shout"
    )

    [refused] = [
        e.payload for e in AgentRunEvent.objects.filter(run=result.run, kind=EventKind.TOOL)
    ]
    assert refused["outcome"] == "invalid_arguments"
    assert "does not match '^(a+)+$'" in refused["error"]
    assert result.outcome == Outcome.AWAITING_APPROVAL
    [shown] = result.run.pending_turn["calls"]
    assert shown["arguments"] == {"text": fine}
    assert mcp_server.tool_calls("shout") == []


# --- A pattern RE2 cannot run is refused, with the reason --------------------------------------


@pytest.mark.django_db
def test_a_backreference_pattern_is_refused_at_sync_with_the_reason(
    mcp_server: TicketServer, client: Any
):
    mcp_server.offer("twice", text_schema(r"^(ab)\1$"))
    mcp_server.offer(
        "ahead",
        {"type": "object", "patternProperties": {"^(?!x)": {"type": "string"}}},
    )
    row = McpServer.objects.create(name="tix", url=mcp_server.url)
    out = StringIO()
    call_command("sync_mcp_tools", "--server", "tix", stdout=out)
    row.refresh_from_db()
    by_name = {e["name"]: e for e in row.tools_snapshot}
    twice = by_name["twice"]["problem"]
    assert "pattern '^(ab)\\\\1$' cannot be checked in bounded time" in twice
    assert "invalid escape sequence: \\1" in twice and "no backreferences" in twice
    ahead = by_name["ahead"]["problem"]
    assert "'^(?!x)' cannot be checked in bounded time" in ahead
    assert "invalid perl operator: (?!" in ahead
    assert f"skipped 'twice': {twice}" in out.getvalue()
    assert registry.get("mcp__tix__twice") is None and registry.get("mcp__tix__ahead") is None
    assert registry.get("mcp__tix__echo") is not None and row.last_sync_error == ""

    # The admin's "Sync tools" shows the same reason to the operator.
    client.force_login(UserFactory(is_superuser=True))
    response = client.post(
        "/admin/agentruns/mcpserver/",
        {"action": "sync_tools", "_selected_action": [row.pk]},
        follow=True,
    )
    [message] = [str(m) for m in response.context["messages"]]
    assert f"skipped 'twice': {twice}" in message


@pytest.mark.parametrize(
    "pattern, reason",
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"(?P<x>a)(?P=x)", "invalid perl operator"),
        ("(?=a)b", "invalid perl operator: (?="),
        ("(?<=a)b", "invalid perl operator: (?<="),
        (r"^\d+\Z", "invalid escape sequence: \\Z"),
        ("(unclosed", "missing )"),
    ],
)
def test_a_local_tool_whose_pattern_re2_cannot_compile_is_not_registered(pattern, reason):
    with pytest.raises(ToolDefinitionError) as refused:
        ToolRegistry().register(read_tool(text_schema(pattern)))
    message = str(refused.value)
    assert message.startswith("tool 'probe' parameters cannot be checked: pattern ")
    assert reason in message


def test_a_schema_that_bypassed_registration_is_unusable_never_checked_with_python_re():
    ran: list[Any] = []
    tool = Tool("twice", "Test.", text_schema(r"^(a)\1$"), "read", lambda c, a: ran.append(a))
    result = invoke_tool(tool, {"text": "aa"}, context())
    assert not result.ok and "its argument schema is unusable" in result.error
    assert "cannot be checked in bounded time" in result.error and ran == []
    with pytest.raises(InvalidSchema, match="cannot be checked"):
        input_errors(text_schema("(?<=a)b"), {"text": "ab"})


def test_unevaluated_properties_beside_pattern_properties_is_refused():
    """jsonschema matches patternProperties with Python's ``re`` to find the evaluated keys."""
    schema = {
        "type": "object",
        "allOf": [{"patternProperties": {"^x": {"type": "string"}}}],
        "unevaluatedProperties": False,
    }
    with pytest.raises(InvalidSchema, match="unevaluatedProperties together with"):
        check_schema(schema, what="s")
    with pytest.raises(InvalidSchema, match="unevaluatedProperties together with"):
        schema_errors(schema, {"x": "1"})
    # Either alone is fine.
    alone = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}
    check_schema(alone, what="s")
    assert [e.message for e in schema_errors(alone, {"a": 1, "b": 2})] == [
        "Unevaluated properties are not allowed ('b' was unexpected)"
    ]


def test_only_schema_positions_are_read_as_patterns():
    named = {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "patternProperties": {"type": "object"}},
        "default": {"pattern": r"(a)\1"},
        "examples": [{"pattern": "(?=x)"}],
        "$defs": {"unevaluatedProperties": {"type": "string"}},
    }
    assert schema_problem(named) is None
    check_schema(named, what="s")


def test_every_draft_runs_its_patterns_on_re2():
    for dialect in (
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    ):
        schema = {**text_schema(CATASTROPHIC), "$schema": dialect}
        check_schema(schema, what=dialect)
        assert len(schema_errors(schema, {"text": "a" * LONG + "!"})) == 1, dialect
        # Draft 4's metaschema does not check patternProperties keys; the walk does.
        keyed = {"$schema": dialect, "type": "object", "patternProperties": {"(?=a)": {}}}
        with pytest.raises(InvalidSchema, match="cannot be checked in bounded time"):
            check_schema(keyed, what=dialect)


# --- A normal pattern, and what RE2 reads ---------------------------------------------------------


def test_a_normal_pattern_still_validates_and_rejects():
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "patternProperties": {"^tag_[a-z]+$": {"type": "string"}},
        "additionalProperties": False,
    }
    check_schema(schema, what="s")
    assert schema_errors(schema, {"code": "ABC", "tag_colour": "red"}) == []
    assert schema_errors(schema, {"code": "ABCD"}) == [
        SchemaError(("code",), "'ABCD' does not match '^[A-Z]{3}$'")
    ]
    assert schema_errors(schema, {"tag_colour": 3}) == [
        SchemaError(("tag_colour",), "3 is not of type 'string'")
    ]
    assert schema_errors(schema, {"other": 1}) == [
        SchemaError((), "'other' does not match any of the regexes: '^tag_[a-z]+$'")
    ]
    plain = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert schema_errors(plain, {"a": 1, "c": 2, "b": 3}) == [
        SchemaError((), "Additional properties are not allowed ('b', 'c' were unexpected)")
    ]


def test_patterns_read_as_json_schema_means_them():
    """RE2 reads the ECMA-262 meanings where Python's ``re`` differs: ``\\d`` is ASCII, ``$``
    ends the text, ``\\p{Lu}`` is a class, ``\\uXXXX`` (and a surrogate pair) is a character."""
    digits = text_schema(r"^\d+$")
    assert schema_errors(digits, {"text": "123"}) == []
    assert len(schema_errors(digits, {"text": "١٢٣"})) == 1  # Arabic-Indic digits
    assert len(schema_errors(digits, {"text": "123\n"})) == 1
    upper = text_schema(r"^\p{Lu}+$")
    check_schema(upper, what="s")
    assert schema_errors(upper, {"text": "ÉCOLE"}) == []
    assert len(schema_errors(upper, {"text": "école"})) == 1
    escaped = text_schema(r"^\u0041\uD83D\uDE00$")
    check_schema(escaped, what="s")
    assert schema_errors(escaped, {"text": "A😀"}) == []
    assert len(schema_errors(escaped, {"text": "Au0041"})) == 1


def test_only_real_u_escapes_are_translated():
    assert ecma_to_re2(r"\u00e9") == r"\x{E9}"
    assert ecma_to_re2(r"\\u00e9") == r"\\u00e9"  # an escaped backslash, then "u00e9"
    assert ecma_to_re2(r"\uD83D\uDE00") == r"\x{1F600}"
    assert ecma_to_re2(r"\u12") == r"\u12"
    assert ecma_to_re2("a\\") == "a\\"


# --- What is checked has a size --------------------------------------------------------------


def test_arguments_over_the_size_bound_are_refused_unchecked():
    schema = text_schema("^a+$")
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MAX_ARGUMENT_CHARS": 1000}):
        assert schema_errors(schema, {"text": "a" * 900}) == []
        [error] = schema_errors(schema, {"text": "a" * 1000})
        assert error.path == ()
        assert error.message == (
            "the value is larger than 1000 characters of JSON (AGENTRUNS_MAX_ARGUMENT_CHARS); "
            "it was not checked"
        )
        many = {"type": "object"}
        assert len(schema_errors(many, {f"k{i}": i for i in range(200)})) == 1
        message = argument_errors(read_tool(schema), {"text": "a" * 5000})
        assert message is not None and "larger than 1000 characters" in message
    default = int(settings.AGENTRUNS.get("MAX_ARGUMENT_CHARS", 131_072))
    assert len(schema_errors(schema, {"text": "a" * (default + 1)})) == 1


def test_a_schema_that_reads_the_same_text_many_times_is_stopped_by_the_scan_budget():
    """Each search is linear, but ``allOf`` of copies multiplies them: one check's patterns read
    at most SCAN_BUDGET_FACTOR x MAX_ARGUMENT_CHARS characters, whatever the schema."""
    copies = {
        "type": "object",
        "properties": {"text": {"allOf": [{"pattern": f"^a+(x{i})?$"} for i in range(40)]}},
    }
    check_schema(copies, what="s")
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "MAX_ARGUMENT_CHARS": 1000}):
        assert schema_errors(copies, {"text": "a" * 190}) == []  # 40 x 190 < 8 x 1000
        [error] = schema_errors(copies, {"text": "a" * 210})  # 40 x 210 > 8000
        assert error.path == ()
        assert error.message == (
            "checking the value would read more than 8000 characters with the schema's "
            "patterns; it was not checked"
        )
        # Keys count too: patternProperties, then additionalProperties, read every key.
        keyed = {
            "type": "object",
            "patternProperties": {f"^k{i}_": {} for i in range(30)},
            "additionalProperties": False,
        }
        assert schema_errors(keyed, {"k1_x": 1}) == []
        assert (
            "would read more than"
            in schema_errors(keyed, {f"k{i}": 1 for i in range(60)})[0].message
        )


def test_arguments_nested_too_deeply_are_refused_unchecked():
    loose = {"type": "object"}
    nested: Any = "x"
    for _ in range(MAX_ARGUMENT_DEPTH):
        nested = {"a": nested}
    assert schema_errors(loose, nested) == []  # 64 objects, one inside the other
    [error] = schema_errors(loose, {"a": nested})
    assert error.path == () and f"nested deeper than {MAX_ARGUMENT_DEPTH} levels" in error.message
    recursive = {"type": "object", "additionalProperties": {"$ref": "#"}}
    deep: Any = {}
    for _ in range(1000):
        deep = {"a": deep}
    assert "nested deeper" in schema_errors(recursive, deep)[0].message


def test_a_schema_nested_too_deeply_or_looping_is_unusable_not_a_crash():
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        nested = {"type": "object", "properties": {"a": nested}}
    with pytest.raises(InvalidSchema, match="nested deeper than 100 levels"):
        check_schema(nested, what="s")
    with pytest.raises(ToolDefinitionError, match="nested deeper"):
        ToolRegistry().register(read_tool(nested))
    looping = {
        "type": "object",
        "$defs": {"a": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}},
    }
    with pytest.raises(InvalidSchema, match="refers to itself without end"):
        schema_errors(looping, {"x": 1})
    result = invoke_tool(read_tool(looping), {"x": 1}, context())
    assert not result.ok and "refers to itself without end" in result.error
