"""Presentation of a run's steps for the playground: the same shape for stored events (the batch
trace) and for events streamed as they are recorded. Values are pre-formatted as text; the
templates escape everything the model chose."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse

from agentruns import event_summaries
from agentruns.event_payloads import InputPayload, LlmPayload, RequestPayload, ToolPayload
from agentruns.jsonview import pretty_json
from agentruns.models import AgentRun, EventKind
from agentruns.services.runtime.transcript import proposed_arguments, request_messages

# The approvals inbox's run timeline, if that app provides one (tried in order).
TIMELINE_URL_NAMES = ("approvals:timeline", "approvals:run_timeline", "approvals:run")


def pretty(value: Any) -> str:
    """Text as it is (a tool's string result, a message); anything else as ``pretty_json``."""
    if isinstance(value, str):
        return value
    return pretty_json(value)


def _payload(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"stored": value}


def _objects(value: Any) -> list[dict[str, Any]]:
    """The objects of a stored list, anything else as an object that shows it: a stored event
    is shown as it is, never a 500 (it may be corrupt)."""
    items = value if isinstance(value, list) else ([] if value in (None, "") else [value])
    return [item if isinstance(item, dict) else {"name": pretty(item)} for item in items]


def _message(message: Any) -> dict[str, Any]:
    message = message if isinstance(message, dict) else {"role": "?", "content": pretty(message)}
    calls = []
    for call in _objects(message.get("tool_calls")):
        stored = call.get("function")
        function: dict[str, Any] = stored if isinstance(stored, dict) else {}
        arguments = function.get("arguments", "")
        try:
            arguments = pretty(json.loads(arguments))
        except (TypeError, ValueError):
            arguments = str(arguments)
        calls.append(
            {"id": call.get("id", ""), "name": function.get("name", ""), "args": arguments}
        )
    content = message.get("content")
    return {
        "role": message.get("role", ""),
        "content": content if isinstance(content, str) else pretty(content),
        "tool_call_id": message.get("tool_call_id", ""),
        "calls": calls,
    }


class ShownRequest(RequestPayload, total=False):
    """A ``request`` step: its payload and the dialogue it sent (``EventSpec.shown``, rebuilt
    for a stored one), never stored."""

    messages: list[Any]


def _request(p: ShownRequest) -> dict[str, Any]:
    messages = p.get("messages")
    return {
        "round": int(p.get("iteration") or 0) + 1,
        "messages": [_message(m) for m in (messages if isinstance(messages, list) else [])],
    }


def _llm(p: LlmPayload) -> dict[str, Any]:
    calls = _objects(p.get("tool_calls"))
    return {
        "usage": p.get("usage") or {},
        "calls": [
            {"id": c.get("id", ""), "name": c.get("name", ""), "args": pretty(c.get("arguments"))}
            for c in calls
        ],
    }


def _tool(p: ToolPayload) -> dict[str, Any]:
    return {
        "arguments_json": pretty(p.get("arguments", {})),
        "result_json": pretty(p.get("result")) if p.get("result") is not None else "",
    }


def _input(p: InputPayload) -> dict[str, Any]:
    return {"values_json": pretty(p.get("values", {}))}


# What a step shows beyond its summary and payload, by kind: the parts ``_step.html`` lays out
# for the dialogue's kinds. Every other kind shows its label, its summary
# (``agentruns.event_summaries``, the timeline's) and its payload.
_DETAILS: dict[str, Callable[[Any], dict[str, Any]]] = {
    EventKind.REQUEST: _request,
    EventKind.LLM: _llm,
    EventKind.TOOL: _tool,
    EventKind.INPUT: _input,
}


def step(
    kind: str,
    payload: Any,
    *,
    duration_ms: int | None = None,
    sequence: int | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """One step of the trace as the ``playground/_step.html`` template expects it."""
    p = payload if isinstance(payload, dict) else {}
    ctx: dict[str, Any] = {
        "kind": kind,
        "p": p,
        "duration_ms": duration_ms,
        "sequence": sequence,
        "actor": actor or p.get("decider") or "",
        "payload_json": pretty(p),
        "summary": event_summaries.summarise(kind, payload),
    }
    details = _DETAILS.get(kind)
    if details is not None:
        ctx.update(details(p))
    return ctx


def render_step(ctx: dict[str, Any]) -> str:
    return render_to_string("playground/_step.html", {"step": ctx})


def stored_steps(run: AgentRun, events: list[Any]) -> list[dict[str, Any]]:
    """The trace of ``run``'s stored ``events``; each request shows the messages it sent,
    rebuilt from the dialogue's events (``transcript.request_messages``)."""
    sent = request_messages(run, events)
    proposed = proposed_arguments(events)
    return [
        step(
            e.kind,
            _stored_payload(e, sent, proposed),
            duration_ms=e.duration_ms,
            sequence=e.sequence,
            actor=e.actor.get_username() if e.actor_id else None,
        )
        for e in events
    ]


def _stored_payload(
    event: Any, sent: dict[int, list[dict[str, Any]]], proposed: dict[str, Any]
) -> Any:
    """What a stored event stands for: a request with the messages it sent, a tool event with
    its arguments (stored only when they differ from the proposed ones)."""
    if event.sequence in sent:
        return {**_payload(event.payload), "messages": sent[event.sequence]}
    payload = event.payload
    if event.kind == EventKind.TOOL and isinstance(payload, dict) and "arguments" not in payload:
        call_id = payload.get("call_id")
        if isinstance(call_id, str) and call_id in proposed:
            return {**payload, "arguments": proposed[call_id]}
    return payload


def timeline_url(run: AgentRun) -> str:
    """The approvals inbox's timeline of ``run``; the admin's run page until that exists."""
    for name in TIMELINE_URL_NAMES:
        for kwargs in ({"uuid": run.uuid}, {"run_uuid": run.uuid}):
            try:
                return reverse(name, kwargs=kwargs)
            except NoReverseMatch:
                continue
    return reverse("admin:agentruns_agentrun_change", args=[run.pk])
