"""The Agents SDK adapter's tests share: two guarded function tools over the playground's notes,
an agent built on the scripted model, and the SDK's tracing switched off (no network)."""

from __future__ import annotations

from typing import Any

from agents import Agent, function_tool, set_tracing_disabled

from agentruns.external import openai_agents
from agentruns.external.openai_agents.scripted import ScriptedTurns, Turn, call, say
from agentruns.models import Effect
from playground.models import Note

set_tracing_disabled(True)

#: What the write's body does after its insert (a test's crash point).
AFTER_WRITE: list[Any] = []


@function_tool
def sdk_save_note(title: str, body: str) -> str:
    """Save a note with a title and a body."""
    key = openai_agents.call_context().idempotency_key
    note = Note.objects.create(title=title, body=body, idempotency_key=key)
    for step in AFTER_WRITE:
        step()
    return f"saved note {note.pk}: {title}"


@function_tool
def sdk_count_notes() -> str:
    """How many notes there are."""
    return str(Note.objects.count())


@function_tool
def sdk_touch_notes() -> str:
    """Mark every note as seen (exempt from approval)."""
    TOUCHED.append(True)
    return "touched"


TOUCHED: list[bool] = []

SAVE_NOTE = openai_agents.leasehold_tool(sdk_save_note, effect=Effect.NON_IDEMPOTENT_WRITE)
COUNT_NOTES = openai_agents.leasehold_tool(sdk_count_notes, effect=Effect.READ)
TOUCH_NOTES = openai_agents.leasehold_tool(
    sdk_touch_notes, effect=Effect.IDEMPOTENT_WRITE, requires_approval=False
)
TOOL_NAMES = ["sdk_save_note", "sdk_count_notes", "sdk_touch_notes"]

NOTE = {"title": "groceries", "body": "eggs"}


def agent(turns: list[Turn], *, name: str = "notes", model: Any = None) -> Agent[Any]:
    return Agent(
        name=name,
        instructions="You keep notes.",
        tools=[SAVE_NOTE, COUNT_NOTES, TOUCH_NOTES],
        model=model if model is not None else ScriptedTurns(turns),
    )


def save_then_answer() -> list[Turn]:
    """Save one note, then say what the tool answered (a denial's message included)."""
    return [
        [call("sdk_save_note", NOTE, call_id="call_save")],
        lambda outputs: [say(f"tool said: {outputs.get('call_save')}")],
    ]
