"""``agentruns.input_forms``: the field order an input spec follows, and the pending turn's
``field_order`` as ``read_pending_turn`` reads it."""

from __future__ import annotations

from agentruns.input_forms import InputValuesForm, input_spec
from agentruns.models import AgentRun, Status
from agentruns.turns import read_pending_turn, turn_digest

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
