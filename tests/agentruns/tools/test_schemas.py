"""``agentruns.tools.schemas``: the one validation path — structured errors (path and message),
their order, the cap, and how each interface receives them (the model's tool message, the
``InvalidInput`` refusal)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from agentruns.exceptions import InvalidInput
from agentruns.models import Effect
from agentruns.tools import Tool, ToolContext, invoke_tool
from agentruns.tools.schemas import (
    MAX_MESSAGE_CHARS,
    MAX_REPORTED_ERRORS,
    InvalidSchema,
    SchemaError,
    check_schema,
    input_errors,
    remote_references,
    schema_errors,
)
from tests.support.http_recorder import HTTPRecorder

ORDER = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 5},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string"}, "lines": {"type": "array"}},
            "required": ["zip"],
        },
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title"],
}


def test_a_valid_instance_has_no_errors():
    assert schema_errors(ORDER, {"title": "ok", "tags": ["a"]}) == []


def test_nested_properties_are_reported_at_their_path():
    errors = schema_errors(ORDER, {"title": "ok", "address": {"zip": 12345}})
    assert errors == [SchemaError(("address", "zip"), "12345 is not of type 'string'")]
    assert errors[0].as_dict() == {"path": ["address", "zip"], "message": errors[0].message}
    assert str(errors[0]) == "address/zip: 12345 is not of type 'string'"


def test_a_missing_required_property_is_reported_at_the_object_that_lacks_it():
    errors = schema_errors(ORDER, {"address": {}})
    assert errors == [
        SchemaError((), "'title' is a required property"),
        SchemaError(("address",), "'zip' is a required property"),
    ]
    assert str(errors[0]) == "'title' is a required property"  # the root has no prefix


def test_array_items_are_paths_with_integer_indexes_in_numeric_order():
    tags = ["ok"] * 11
    tags[2] = 2
    tags[10] = 10
    errors = schema_errors(ORDER, {"title": "ok", "tags": tags})
    assert [e.path for e in errors] == [("tags", 2), ("tags", 10)]  # 2 before 10, as integers
    assert json.loads(json.dumps(errors[1].as_dict())) == {
        "path": ["tags", 10],
        "message": "10 is not of type 'string'",
    }


def test_the_order_is_by_path_then_message_whatever_the_schema_key_order():
    instance = {"tags": [1], "title": "far too long", "address": {"zip": 1}, "extra": 0}
    reordered = {
        "required": ["title"],
        "properties": dict(reversed(list(ORDER["properties"].items()))),
        "type": "object",
    }
    strict = {**ORDER, "additionalProperties": False}
    errors = schema_errors(strict, instance)
    assert [e.path for e in errors] == [(), ("address", "zip"), ("tags", 0), ("title",)]
    assert schema_errors({**reordered, "additionalProperties": False}, instance) == errors
    assert schema_errors(strict, instance) == errors  # the same instance, the same list


def test_errors_at_one_path_are_ordered_by_message_whatever_the_keyword_order():
    code = {"type": "object", "properties": {"code": {"minLength": 4, "pattern": "^A"}}}
    edoc = {"type": "object", "properties": {"code": {"pattern": "^A", "minLength": 4}}}
    errors = schema_errors(code, {"code": "xy"})
    assert errors == [
        SchemaError(("code",), "'xy' does not match '^A'"),
        SchemaError(("code",), "'xy' is too short"),
    ]
    assert schema_errors(edoc, {"code": "xy"}) == errors


def test_the_cap_keeps_the_first_errors_and_says_how_many_more():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    instance = {f"k{i}": "x" for i in range(MAX_REPORTED_ERRORS + 3)}
    errors = schema_errors(schema, instance)
    assert len(errors) == MAX_REPORTED_ERRORS + 1
    assert [e.path for e in errors[:-1]] == [(f"k{i}",) for i in range(MAX_REPORTED_ERRORS)]
    assert errors[-1] == SchemaError((), "... and 3 more")


def test_exactly_the_cap_has_no_summary_entry():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    errors = schema_errors(schema, {f"k{i}": "x" for i in range(MAX_REPORTED_ERRORS)})
    assert len(errors) == MAX_REPORTED_ERRORS
    assert all(e.path for e in errors)


def test_long_messages_are_cut():
    (error,) = schema_errors(ORDER, {"title": "x" * 1000})
    assert len(error.message) == MAX_MESSAGE_CHARS and error.message.endswith("…")


def test_input_must_be_an_object():
    assert input_errors(ORDER, ["title"]) == [SchemaError((), "values must be an object, got list")]
    assert input_errors(ORDER, {"title": "ok"}) == []


def test_the_below_view_drops_leading_keys():
    error = SchemaError(("tags", 3), "bad")
    assert error.below(1) == SchemaError((3,), "bad")
    assert str(error.below(2)) == "bad"


def test_the_model_reads_the_same_errors_as_one_line():
    spy = Tool("order", "Orders.", ORDER, Effect.READ, lambda ctx, args: "ran")
    context = ToolContext(uuid.uuid4(), "call-1", None, 1, 1.0)
    result = invoke_tool(spy, {"title": "ok", "address": {"zip": 1}, "tags": ["a", 2]}, context)
    assert not result.ok
    assert result.error == (
        "invalid arguments for tool 'order': address/zip: 1 is not of type 'string'; "
        "tags/1: 2 is not of type 'string'"
    )


def test_invalid_input_carries_typed_errors_and_json_detail():
    errors = schema_errors(ORDER, {"title": 3})
    refused = InvalidInput(errors=errors)
    assert refused.errors == tuple(errors)
    assert refused.as_dict() == {
        "code": "invalid_input",
        "message": "The submitted values do not match the input schema.",
        "errors": [{"path": ["title"], "message": "3 is not of type 'string'"}],
    }
    assert InvalidInput().as_dict()["errors"] == []


# --- References stay inside the schema -------------------------------------------------------


def referring_to(url: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"$ref": url}}}


def test_validation_never_fetches_a_remote_reference(http_recorder: HTTPRecorder):
    # The recorder would answer with a schema; nothing may ask it for one.
    schema = referring_to(http_recorder.url("/x.json"))
    with pytest.raises(InvalidSchema, match="does not resolve"):
        schema_errors(schema, {"a": 1})
    with pytest.raises(InvalidSchema):
        input_errors(schema, {"a": 1})
    assert http_recorder.requests == []


def test_a_tool_whose_schema_refers_outside_it_is_never_run_and_fetches_nothing(
    http_recorder: HTTPRecorder,
):
    ran = []
    # Built directly: check_tool (which refuses it) never saw this definition.
    tool = Tool(
        "fetchy",
        "Refers outside.",
        referring_to(http_recorder.url("/x.json")),
        Effect.READ,
        lambda ctx, args: ran.append(args),
    )
    result = invoke_tool(tool, {"a": 1}, ToolContext(uuid.uuid4(), "call-1", None, 1, 1.0))
    assert not result.ok and "its argument schema is unusable" in result.error
    assert ran == [] and http_recorder.requests == []


def test_local_references_resolve_without_a_registry_of_ours():
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/code"}},
        "$defs": {"code": {"type": "string"}},
    }
    check_schema(schema, what="s")
    assert schema_errors(schema, {"a": 1}) == [SchemaError(("a",), "1 is not of type 'string'")]
    with pytest.raises(InvalidSchema, match="does not resolve"):
        schema_errors(referring_to("#/$defs/missing"), {"a": 1})


@pytest.mark.parametrize(
    "reference",
    [
        "http://127.0.0.1:8783/x.json",
        "https://json-schema.org/draft/2020-12/schema",
        "other.json",
        "other.json#/$defs/x",
        "/abs/path.json",
        "urn:example:thing",
        "",
    ],
)
def test_check_schema_refuses_every_reference_not_starting_with_a_hash(reference):
    with pytest.raises(InvalidSchema, match="only references inside the schema"):
        check_schema(referring_to(reference), what="tool 't' parameters")


def test_references_are_found_at_any_depth_and_under_every_reference_key():
    schema = {
        "type": "object",
        "properties": {
            "$ref": {"type": "string"},  # a property named $ref is not a reference
            "list": {"type": "array", "items": {"anyOf": [{"$ref": "#"}, {"$ref": "a.json"}]}},
            "dynamic": {"$dynamicRef": "b.json#meta"},
        },
        "$defs": {"deep": {"allOf": [{"not": {"$ref": "http://x/c.json"}}]}},
    }
    assert sorted(remote_references(schema)) == ["a.json", "b.json#meta", "http://x/c.json"]
    with pytest.raises(InvalidSchema):
        check_schema(schema, what="s")
    nested: dict[str, Any] = {"$ref": "http://x/deep.json"}
    for _ in range(5000):  # deeper than the interpreter's recursion limit
        nested = {"items": nested}
    assert remote_references(nested) == ["http://x/deep.json"]


def test_a_schema_changed_after_validating_is_validated_as_it_is_now():
    """Validators are kept per schema object (``schemas._validator``): a schema mutated in place
    is checked by its new text, and an equal schema elsewhere never borrows a stale one."""
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert schema_errors(schema, {"n": 1}) == []
    assert schema_errors(schema, {"n": 1}) == []  # the kept validator
    schema["properties"]["n"]["type"] = "string"
    assert [e.path for e in schema_errors(schema, {"n": 1})] == [("n",)]
    other = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert schema_errors(other, {"n": 1}) == []
    assert [e.path for e in schema_errors(schema, {"n": 1})] == [("n",)]
    # Same text, different values for Python (an integer key): never shared.
    keyed: dict[str, Any] = {"type": "object", "properties": {1: {"type": "string"}}}
    named: dict[str, Any] = {"type": "object", "properties": {"1": {"type": "string"}}}
    assert schema_errors(keyed, {"1": 5}) == []
    assert [e.path for e in schema_errors(named, {"1": 5})] == [("1",)]


# --- A standing approval's arguments schema (check_matching_schema) ------------------------------


def test_a_matching_schema_needs_no_object_type_and_is_bounded():
    from agentruns.tools.schemas import check_matching_schema

    check_matching_schema(
        {"properties": {"url": {"const": "https://hooks.example/deploy"}}, "required": ["url"]},
        what="arguments_schema",
    )
    for hostile, says in [
        ([], "must be a JSON schema object"),
        ({"pattern": "(?<=a)b"}, "pattern"),
        ({"$ref": "#"}, "without end"),
        ({"$ref": "http://example.com/s.json"}, "only references inside"),
        ({"enum": ["x" * 200_000]}, "too large"),
    ]:
        with pytest.raises(InvalidSchema, match=says):
            check_matching_schema(hostile, what="arguments_schema")
