"""Rebuilding a run's dialogue and loop state from what is stored (docs/design.md §6.5).

The event stream is the transcript: every ``llm`` event becomes an assistant message, every
``tool`` event a tool message and every ``output_check`` event (a final answer sent back,
``structured_output``) a user message, in sequence order. A continuing segment in any process
therefore sends the provider exactly what an uninterrupted segment would have sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentruns.models import AgentRun, AgentRunEvent, EventKind
from agentruns.providers.base import ToolCall
from agentruns.services.runtime.structured_output import schema_instruction
from agentruns.tools import ToolResult

# What the model reads for a call that never ran (``agentruns.tools.result_kinds``), re-exported
# for the runtime's callers.
from agentruns.tools.result_kinds import DENIED_MESSAGE as DENIED_MESSAGE
from agentruns.tools.result_kinds import EXPIRED_MESSAGE as EXPIRED_MESSAGE
from agentruns.tools.result_kinds import denied_message as denied_message
from agentruns.turns import LoopState, Unreadable
from agentruns.versions import pinned_or_live


class NotRehydratable(Exception):
    """The stored state of a run cannot be turned back into a dialogue and a loop state."""


#: A ``tool`` event's outcome for a call a person answered in place of running it.
ANSWERED = "answered"


def system_prompt_for(run: AgentRun) -> str:
    """The request's system prompt, else the pinned configuration version's; followed by what
    the answer must be when that version sets an ``output_schema``."""
    request = run.request if isinstance(run.request, dict) else {}
    override = request.get("system_prompt")
    configuration = pinned_or_live(run)  # the run's version (a segment pinned it already)
    prompt = override if isinstance(override, str) and override else configuration.system_prompt
    schema = configuration.output_schema
    if schema is None:
        return prompt
    return "\n\n".join(part for part in (prompt, schema_instruction(schema)) if part)


def opening_messages(run: AgentRun) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = system_prompt_for(run)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": run.prompt})
    return messages


def message_for_event(kind: str, payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The dialogue message an event stands for, or ``None`` for bookkeeping events."""
    if kind == EventKind.LLM:
        message: dict[str, Any] = {"role": "assistant", "content": payload.get("content") or ""}
        calls = payload.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call.get("arguments", {}), sort_keys=True),
                    },
                }
                for call in calls
            ]
        return message
    if kind == EventKind.TOOL:
        return {
            "role": "tool",
            "tool_call_id": payload["call_id"],
            "content": tool_message_content(payload),
        }
    if kind == EventKind.OUTPUT_CHECK:
        return {"role": "user", "content": str(payload["message"])}
    return None


def tool_message_content(payload: Mapping[str, Any]) -> str:
    """The tool message the model read for a ``tool`` event.

    A ``tool`` event stores the call's ``result`` (or ``error``) once; the message is derived
    from it (``ToolResult.as_message_content``, canonical JSON, so it survives a database that
    reorders keys). Only an event whose message differs from that derivation — a reconciliation
    verdict, and events written before the message was derived — stores ``content`` itself.
    """
    stored = payload.get("content")
    if isinstance(stored, str):
        return stored
    marked = _person_marked(payload)
    if marked is not None:
        return json.dumps(marked, ensure_ascii=False, sort_keys=True)
    return ToolResult(
        ok=payload.get("ok") is True,
        content=payload.get("result"),
        error=str(payload.get("error") or ""),
    ).as_message_content()


def _person_marked(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tool message of a call a person decided in particular, as the model reads it: a
    denial with the reviewer's reason (verbatim, under a key that says whose words they are),
    an answer given in place of running the tool, or a result of arguments a person edited
    (with the arguments it ran with). ``None`` for any other call."""
    outcome = payload.get("outcome")
    reason = payload.get("reason")
    if outcome == "denied" and isinstance(reason, str) and reason:
        return {"error": str(payload.get("error") or ""), "reason_given_by_the_reviewer": reason}
    if outcome == ANSWERED:
        return {
            "answered_by_a_person": str(payload.get("decided_by") or ""),
            "note": "a person gave this result in place of running the tool: the tool did not run",
            "result": payload.get("result"),
        }
    edit = payload.get("edit")
    if not isinstance(edit, dict):
        return None
    marked: dict[str, Any] = {
        "arguments_edited_by_a_person": str(edit.get("editor") or ""),
        "note": "a person changed this call's arguments before it ran; it ran with arguments_run",
        "arguments_run": payload.get("arguments"),
    }
    if payload.get("ok") is True:
        marked["result"] = payload.get("result")
    else:
        marked["error"] = str(payload.get("error") or "")
    return marked


@dataclass
class Rehydrated:
    loop_state: LoopState
    messages: list[dict[str, Any]]
    next_sequence: int


def parse_loop_state(state: Any) -> LoopState:
    """The stored loop state, typed; ``NotRehydratable`` when it is corrupt."""
    try:
        return LoopState.parse(state)
    except Unreadable as exc:
        raise NotRehydratable(str(exc)) from exc


def rehydrate(run: AgentRun, events: Iterable[AgentRunEvent] | None = None) -> Rehydrated:
    """The loop state and the dialogue of ``run`` as its last step boundary left them."""
    state = parse_loop_state(run.loop_state)
    if events is None:
        # Not ``run.events``: a related manager sets ``event.run`` on every row, which reads the
        # deferred ``run_id`` back one query per event (N+1) when it is left out of ``only()``.
        events = (
            AgentRunEvent.objects.filter(run_id=run.pk)
            .order_by("sequence")
            .only("sequence", "kind", "payload")
        )
    messages = opening_messages(run)
    last = -1
    for event in events:
        if event.sequence != last + 1:
            raise NotRehydratable(f"event sequence gap after {last}")
        last = event.sequence
        if not isinstance(event.payload, dict):
            raise NotRehydratable(f"event {event.sequence} has a malformed payload")
        try:
            message = message_for_event(event.kind, event.payload)
        except (KeyError, TypeError) as exc:
            raise NotRehydratable(f"event {event.sequence} cannot be replayed: {exc}") from exc
        if message is not None:
            messages.append(message)
    return Rehydrated(loop_state=state, messages=messages, next_sequence=last + 1)


def unique_call_ids(
    calls: Iterable[ToolCall], messages: Iterable[Mapping[str, Any]], iteration: int
) -> list[ToolCall]:
    """``calls`` with ids made unique within the dialogue ``messages``: ids key idempotency and
    turn digests, and some OpenAI-compatible servers reuse ids such as ``call_0`` on every
    turn. A missing id becomes ``call_<iteration>_<index>``; a taken one gains ``~<iteration>``."""
    seen = {call["id"] for message in messages for call in message.get("tool_calls", [])}
    unique: list[ToolCall] = []
    for call in calls:
        call_id = call.id or f"call_{iteration}_{len(unique)}"
        while call_id in seen:
            call_id = f"{call_id}~{iteration}"
        seen.add(call_id)
        unique.append(ToolCall(id=call_id, name=call.name, arguments=call.arguments))
    return unique


def request_messages(
    run: AgentRun, events: Iterable[AgentRunEvent] | None = None
) -> dict[int, list[dict[str, Any]]]:
    """The messages each ``request`` event of ``run`` sent, by event sequence.

    A request event stores how many messages it sent, and the system prompt when it is not the
    one the previous request sent; the rest is the run's prompt and the ``llm`` and ``tool``
    events before it, so the dialogue is stored once however many rounds it has. Older request
    events that stored their messages are read as they are.
    """
    if events is None:
        events = AgentRunEvent.objects.filter(run_id=run.pk).order_by("sequence")
    sent: dict[int, list[dict[str, Any]]] = {}
    dialogue: list[dict[str, Any]] = []
    system: Any = None
    for event in events:
        payload = event.payload if isinstance(event.payload, dict) else {}
        if event.kind == EventKind.REQUEST:
            if isinstance(payload.get("messages"), list):
                sent[event.sequence] = list(payload["messages"])
                continue
            # A request stores its system prompt when it differs from the previous request's
            # (and on a segment's first request); without the key, the previous one was sent.
            if "system" in payload:
                system = payload.get("system")
            opening = [{"role": "system", "content": system}] if system else []
            opening.append({"role": "user", "content": run.prompt})
            count = payload.get("message_count")
            whole = opening + dialogue
            sent[event.sequence] = whole[:count] if isinstance(count, int) else whole
            continue
        try:
            message = message_for_event(event.kind, payload)
        except (KeyError, TypeError):
            continue
        if message is not None:
            dialogue.append(message)
    return sent


def proposed_arguments(events: Iterable[AgentRunEvent]) -> dict[str, Any]:
    """The arguments the model proposed for each call of ``events``, by call id: what a ``tool``
    event ran with when it stores no ``arguments`` of its own."""
    proposed: dict[str, Any] = {}
    for event in events:
        if event.kind != EventKind.LLM or not isinstance(event.payload, dict):
            continue
        calls = event.payload.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                proposed[call["id"]] = call.get("arguments", {})
    return proposed
