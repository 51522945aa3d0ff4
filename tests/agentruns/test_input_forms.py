"""``agentruns.input_forms``: the field order an input spec follows, the pending turn's
``field_order`` as ``read_pending_turn`` reads it, and the service's schema errors attached to
fields by their path."""

from __future__ import annotations

import pytest

from agentruns.input_forms import InputValuesForm, input_form_for, input_spec
from agentruns.models import AgentRun, Status
from agentruns.tools.schemas import SchemaError
from agentruns.turns import APPROVAL, INPUT, PendingTurn, read_pending_turn, turn_digest

SCHEMA = {
    "type": "object",
    "properties": {key: {"type": "string"} for key in ["a", "m", "z"]},  # as jsonb stores them
}


def keys(spec) -> list[str]:
    return list(spec.keys.values())


def test_without_an_order_the_fields_follow_the_stored_schema():
    assert keys(input_spec(SCHEMA)) == ["a", "m", "z"]


def test_the_order_decides_and_keys_missing_from_it_go_last_in_stored_order():
    assert keys(input_spec(SCHEMA, order=["z", "a", "m"])) == ["z", "a", "m"]
    assert keys(input_spec(SCHEMA, order=["m", "gone", "m"])) == ["m", "a", "z"]


def test_values_are_keyed_by_schema_key_whatever_the_order():
    spec = input_spec(SCHEMA, order=["z", "a", "m"])
    form = InputValuesForm({"f0": "last", "f1": "first"}, spec=spec)
    assert form.is_valid(), form.errors
    assert form.values() == {"z": "last", "a": "first"}


def test_the_pending_turn_reads_its_field_order_outside_the_digest():
    call = {"id": "call_0_0", "name": "ask_human", "arguments": {}}
    stored = {
        "kind": "input",
        "call": {**call, "effect": "read"},
        "input_schema": SCHEMA,
        "field_order": ["z", "a", "m"],
        "turn_digest": turn_digest([call], input_schema=SCHEMA),
    }
    pending = read_pending_turn(AgentRun(status=Status.WAITING_FOR_INPUT, pending_turn=stored))
    assert pending.field_order == ("z", "a", "m")
    for odd in (
        {**stored, "field_order": "zam"},
        {k: v for k, v in stored.items() if k != "field_order"},
    ):
        run = AgentRun(status=Status.WAITING_FOR_INPUT, pending_turn=odd)
        assert read_pending_turn(run).field_order == ()


# --- One builder for the inbox and the playground -----------------------------------------------


def test_the_form_for_a_pending_turn_follows_its_field_order_and_prefix():
    pending = PendingTurn(kind=INPUT, input_schema=SCHEMA, field_order=("z", "a", "m"))
    spec, form = input_form_for(pending, prefix="run7")
    assert keys(spec) == ["z", "a", "m"] and form is not None and not form.is_bound
    _, bound = input_form_for(pending, {"run7-f0": "last", "run7-f1": "first"}, prefix="run7")
    assert bound is not None and bound.is_valid(), bound.errors
    assert bound.values() == {"z": "last", "a": "first"}


def test_no_form_when_the_spec_cannot_be_offered():
    required_list = {
        "type": "object",
        "properties": {"items": {"type": "array"}},
        "required": ["items"],
    }
    spec, form = input_form_for(PendingTurn(kind=INPUT, input_schema=required_list), prefix="p")
    assert form is None and spec.blocking


def test_only_an_input_turn_has_an_input_form():
    with pytest.raises(ValueError):
        input_form_for(PendingTurn(kind=APPROVAL), prefix="p")


# --- Schema errors from the service, attached by path ---------------------------------------


def bound_form(order: list[str] | None = None) -> InputValuesForm:
    form = InputValuesForm({"f0": "x", "f1": "y", "f2": "z"}, spec=input_spec(SCHEMA, order))
    assert form.is_valid(), form.errors
    return form


def test_an_error_at_a_field_key_is_shown_on_that_field():
    form = bound_form(order=["z", "a", "m"])
    form.add_schema_errors([SchemaError(("a",), "'y' does not match '^A'")])
    assert form.errors == {"f1": ["'y' does not match '^A'"]}  # "a" is the second field here
    assert form.schema_errors == []
    assert form.has_problems
    assert form.error_sentences() == ["a: 'y' does not match '^A'"]


def test_a_nested_error_is_shown_on_its_field_with_the_rest_of_its_path():
    form = bound_form()
    form.add_schema_errors([SchemaError(("m", 0, "x"), "bad")])
    assert form.errors == {"f1": ["0/x: bad"]}


def test_errors_at_the_root_or_an_unknown_key_are_shown_on_the_form():
    form = bound_form()
    form.add_schema_errors(
        [
            SchemaError((), "'q' is a required property"),
            SchemaError(("q",), "3 is not of type 'string'"),
            SchemaError(("a/b",), "not the field a"),  # a key is matched whole, never parsed
        ]
    )
    assert form.errors == {}
    assert [str(e) for e in form.schema_errors] == [
        "'q' is a required property",
        "q: 3 is not of type 'string'",
        "a/b: not the field a",
    ]
    assert form.has_problems
    assert form.error_sentences() == [str(e) for e in form.schema_errors]


def test_a_refusal_without_errors_still_marks_the_form():
    form = bound_form()
    form.add_schema_errors([])
    assert [str(e) for e in form.schema_errors] == ["The values do not match the schema."]
    assert form.has_problems


def test_the_forms_own_problems_as_schema_errors_at_their_keys():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "title": "N"}, "s": {"type": "string"}},
        "required": ["s"],
    }
    form = InputValuesForm({"f0": "two"}, spec=input_spec(schema))
    assert not form.is_valid()
    assert form.problems() == [
        SchemaError(("n",), "Enter a whole number."),
        SchemaError(("s",), "This field is required."),
    ]
    assert form.error_sentences() == ["N: Enter a whole number.", "s: This field is required."]
