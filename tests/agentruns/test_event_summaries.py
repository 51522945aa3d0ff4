"""The one table of event summaries (``agentruns.event_summaries``) and the payload shapes it
reads (``agentruns.event_payloads``): every kind has both, nothing stored makes a summary raise,
and what a model, a tool or a person chose is escaped wherever a summary is shown."""

from __future__ import annotations

import logging
from typing import Any, get_type_hints

import pytest
from django.template import Context, Template
from django.utils.html import escape

from agentruns import event_summaries
from agentruns.event_payloads import PAYLOADS
from agentruns.models import EventKind
from playground import trace
from tests.agentruns.factories import AgentRunFactory, UserFactory

HOSTILE = '<img src=x onerror="pwn()">&<b>'
RAW = "<img src=x"  # what must never reach a page unescaped

# One payload per kind, shaped as its builder writes it, with what an outsider chose (a tool's
# name, arguments, an answer, evidence, a note, an error) hostile.
HOSTILE_PAYLOADS: dict[str, dict[str, Any]] = {
    EventKind.REQUEST: {"iteration": 0, "final": False, "message_count": 2, "tools": [HOSTILE]},
    EventKind.LLM: {
        "iteration": 1,
        "final": False,
        "content": HOSTILE,
        "tool_calls": [{"id": "c1", "name": HOSTILE, "arguments": {"path": HOSTILE}}],
        "usage": {},
        "model": HOSTILE,
    },
    EventKind.TOOL: {
        "call_id": "c1",
        "name": HOSTILE,
        "arguments": {"q": HOSTILE},
        "effect": "read",
        "outcome": "executed",
        "ok": False,
        "error": HOSTILE,
    },
    EventKind.APPROVAL: {"approved": True, "calls": [{"id": "c1", "name": HOSTILE}]},
    EventKind.INPUT: {"call_id": "c1", "name": HOSTILE, "values": {"a": HOSTILE}},
    EventKind.RECONCILIATION: {"verdict": "landed", "by": "check", "evidence": HOSTILE},
    EventKind.LEASE: {"action": HOSTILE},
    EventKind.REAPER: {"rule": HOSTILE, "verdict": HOSTILE, "detail": HOSTILE},
    EventKind.CANCEL: {"note": HOSTILE},
    EventKind.VERIFICATION: {"verdict": "preview_changed", "name": HOSTILE, "message": "m"},
    EventKind.ERROR: {"type": "ValueError", "message": HOSTILE},
    EventKind.IN_DOUBT: {"call_id": "c1", "name": HOSTILE, "arguments": {}, "error": HOSTILE},
    EventKind.CHECK: {"attempt": 1, "answer": "unknown", "evidence": HOSTILE},
    EventKind.BUDGET: {"budget": "user", "spend": HOSTILE, "limit": "1", "currency": "USD"},
    EventKind.ESCALATION: {"group": HOSTILE, "timeout_seconds": 3600, "then": HOSTILE},
    EventKind.OUTPUT_CHECK: {
        "ok": False,
        "errors": [{"path": [HOSTILE], "message": HOSTILE}],
        "message": HOSTILE,
    },
}

# The kinds the playground trace lays out itself (``playground/_step.html``).
LAID_OUT = {"request", "llm", "tool", "approval", "input", "budget"}

# What a corrupt or older stored payload may hold instead.
MALFORMED: list[Any] = [
    None,
    "a string",
    ["a", "list"],
    {},
    {"verdict": ["unhashable"], "effect": {"un": "hashable"}, "action": ["x"], "rule": {}},
    {"tool_calls": "not a list", "calls": [1, None, "x"], "name": None, "iteration": "x"},
    {key: {"nested": []} for key in ("outcome", "ok", "by", "note", "message", "type", "day")},
    {"cost": ["x"], "content": {"a": 1}, "evidence": None, "attempt": [], "reserved": "NaN"},
]


def test_every_kind_has_a_payload_shape_and_a_summary_and_nothing_else_does():
    assert set(PAYLOADS) == set(EventKind.values)
    assert set(event_summaries.SUMMARIES) == set(EventKind.values)
    assert set(HOSTILE_PAYLOADS) == set(EventKind.values)  # the tests below cover every kind


@pytest.mark.parametrize("kind", EventKind.values)
def test_each_summary_reads_its_own_payload_shape(kind):
    summary = event_summaries.SUMMARIES[kind]
    assert get_type_hints(summary)["p"] is PAYLOADS[kind]
    assert event_summaries.summarise(kind, HOSTILE_PAYLOADS[kind])  # says something


@pytest.mark.parametrize("kind", EventKind.values)
@pytest.mark.parametrize("payload", MALFORMED)
def test_a_malformed_payload_never_raises(kind, payload):
    assert isinstance(event_summaries.summarise(kind, payload), str)


def test_a_payload_a_summary_cannot_read_reads_unreadable_and_is_logged(caplog, monkeypatch):
    def broken(p: Any) -> str:
        raise KeyError("boom")

    monkeypatch.setitem(event_summaries.SUMMARIES, EventKind.CANCEL, broken)
    with caplog.at_level(logging.WARNING, logger="agentruns.event_summaries"):
        assert event_summaries.summarise("cancel", {}) == event_summaries.UNREADABLE
    assert "cancel" in caplog.text


@pytest.mark.parametrize("kind", ["from_the_future", "", None, 5, ["llm"]])
def test_an_unknown_kind_reads_as_a_generic_summary(kind):
    assert event_summaries.summarise(kind, {"note": HOSTILE}) == event_summaries.UNKNOWN_KIND


def test_unhashable_values_read_as_text_where_they_used_to_raise():
    assert event_summaries.summarise("reconciliation", {"verdict": ["x"]}) == "Reconciled: ['x']"
    tool = event_summaries.summarise("tool", {"name": "n", "effect": [], "outcome": "executed"})
    assert tool.startswith("n — Write (effect not recorded")


def _rendered_summary(kind: str, payload: Any) -> str:
    event = AgentRunFactory.build().events.model(kind=kind, payload=payload)
    source = "{% load approvals_tags %}[{{ event|event_summary }}]"
    return Template(source).render(Context({"event": event}))


@pytest.mark.parametrize("kind", EventKind.values)
def test_hostile_text_in_each_kinds_summary_is_escaped_in_the_timeline_and_the_trace(kind):
    payload = HOSTILE_PAYLOADS[kind]
    plain = event_summaries.summarise(kind, payload)
    shown = _rendered_summary(kind, payload)
    assert shown == f"[{escape(plain)}]"
    step = trace.render_step(trace.step(kind, payload))
    assert RAW not in shown and RAW not in step
    if kind != EventKind.REQUEST:  # a request's summary quotes nothing anyone chose
        assert HOSTILE in plain and escape(HOSTILE) in shown
    if kind not in LAID_OUT:  # the trace's line for every other kind is the summary
        assert escape(plain) in step


@pytest.mark.django_db
def test_the_run_timeline_shows_each_kinds_summary_escaped(client):
    user = UserFactory(username="root", is_superuser=True, is_staff=True)
    run = AgentRunFactory(initiator=user)
    for sequence, (kind, payload) in enumerate(HOSTILE_PAYLOADS.items()):
        run.events.create(sequence=sequence, kind=kind, payload=payload)
    run.events.create(sequence=99, kind="from_the_future", payload={"note": HOSTILE})
    client.force_login(user)

    timeline = client.get(f"/admin/approvals/runs/{run.uuid}/")
    playground = client.get(f"/playground/runs/{run.uuid}/")
    assert timeline.status_code == playground.status_code == 200
    assert RAW not in timeline.content.decode() and RAW not in playground.content.decode()
    for kind, payload in HOSTILE_PAYLOADS.items():
        assert escape(event_summaries.summarise(kind, payload)) in timeline.content.decode(), kind
    assert event_summaries.UNKNOWN_KIND in timeline.content.decode()
