"""``agentruns.jsonview.pretty_json``: the one JSON printer of the admin, the inbox and the
playground — stable, non-ASCII kept, never raising."""

from __future__ import annotations

import datetime
import uuid

from django.template import Context, Template

from agentruns.admin import AgentRunAdmin
from agentruns.jsonview import pretty_json
from playground import trace


def test_indented_and_key_sorted_so_the_same_value_prints_the_same():
    assert pretty_json({"b": 1, "a": [True, None]}) == (
        '{\n  "a": [\n    true,\n    null\n  ],\n  "b": 1\n}'
    )
    assert pretty_json({"b": 1, "a": 2}) == pretty_json({"a": 2, "b": 1})


def test_non_ascii_is_kept():
    assert pretty_json({"title": "Café — 東京"}) == '{\n  "title": "Café — 東京"\n}'


def test_leaves_json_cannot_hold_print_as_text_and_nothing_raises():
    when = datetime.date(2026, 1, 2)
    key = uuid.UUID(int=1)
    assert pretty_json({"on": when, "id": key}) == (
        f'{{\n  "id": "{key}",\n  "on": "2026-01-02"\n}}'
    )
    cycle: list = []
    cycle.append(cycle)
    assert pretty_json(cycle) == "[[...]]"
    assert pretty_json({1: "a", "b": 2}) == repr({1: "a", "b": 2})  # keys that cannot be sorted


def test_every_interface_prints_with_it():
    value = {"z": "ünïcode", "a": [1, 2]}
    assert AgentRunAdmin._pretty(value) == f"<pre>{pretty_json(value)}</pre>".replace('"', "&quot;")
    assert trace.pretty(value) == pretty_json(value)
    assert trace.pretty("plain text") == "plain text"  # text stays text in the trace
    rendered = Template("{% load approvals_tags %}{{ value|pretty_json }}").render(
        Context({"value": value}, autoescape=False)
    )
    assert rendered == pretty_json(value)
