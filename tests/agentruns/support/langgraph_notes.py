"""A LangGraph notes assistant for the adapter's tests: two LangChain tools declared to Leasehold
(``search_notes``, a read; ``save_note``, a non-idempotent write with a preview and a check), a
scripted fake model (langchain-core's, answering by how many answers the conversation holds, so
a replay or a resume gets the same answer) and the graph: agent → Leasehold's tool node → agent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from agentruns.external import langgraph as lh
from agentruns.models import Effect
from agentruns.tools import CheckAnswer, CheckContext, ToolContext, registry
from agentruns.turns import Change, Preview
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory

TOOL_NAMES = ["search_notes", "save_note"]

#: Set by a test to act inside ``save_note``'s body (after the fence, before the insert).
during_save: list[Callable[[], None]] = []
#: How many times ``save_note``'s body ran.
saves: list[dict[str, Any]] = []


@lc_tool
def search_notes(query: str) -> list[dict[str, Any]]:
    """Find notes whose title contains the query."""
    return [{"id": n.pk, "title": n.title} for n in Note.objects.filter(title__icontains=query)]


@lc_tool
def save_note(title: str, body: str) -> dict[str, Any]:
    """Save a new note."""
    context = lh.call_context()
    saves.append({"title": title, "key": context.idempotency_key if context else None})
    for hook in during_save:
        hook()
    key = context.idempotency_key if context is not None else None
    try:
        with transaction.atomic():
            note = Note.objects.create(title=title, body=body, idempotency_key=key)
    except IntegrityError:
        return {"error": "already saved"}
    return {"id": note.pk, "title": note.title}


def preview_save(context: ToolContext, arguments: dict[str, Any]) -> Preview:
    return Preview(
        summary=f"saves a note titled {arguments.get('title')!r}",
        changes=(Change(field="title", after=arguments.get("title")),),
    )


def check_save(context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
    note = Note.objects.filter(idempotency_key=context.idempotency_key).first()
    if note is None:
        return CheckAnswer.not_landed("no note carries the key")
    return CheckAnswer.landed(f"note {note.pk}", result={"id": note.pk, "title": note.title})


@pytest.fixture
def notes_tools() -> Iterator[None]:
    """Declare the two tools for the test, and forget them after."""
    lh.leasehold_tool(search_notes, effect=Effect.READ)
    lh.leasehold_tool(
        save_note, effect=Effect.NON_IDEMPOTENT_WRITE, preview=preview_save, check=check_save
    )
    during_save.clear()
    saves.clear()
    yield
    for name in TOOL_NAMES:
        registry.unregister(name)
    during_save.clear()


class ScriptedChat(FakeMessagesListChatModel):
    """``responses[n]`` where ``n`` counts the answers already in the conversation."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        answered = sum(isinstance(m, AIMessage) for m in messages)
        message = self.responses[min(answered, len(self.responses) - 1)]
        return ChatResult(generations=[ChatGeneration(message=message.model_copy())])


def answer(*calls: tuple[str, str, dict[str, Any]], text: str = "") -> AIMessage:
    return AIMessage(
        content=text,
        tool_calls=[{"id": i, "name": n, "args": a, "type": "tool_call"} for i, n, a in calls],
    )


SAVE = ("call_save", "save_note", {"title": "groceries", "body": "eggs"})
SCRIPT = [answer(SAVE), answer(text="Saved your note.")]


def build_graph(responses: list[AIMessage] | None = None, checkpointer: Any = None) -> Any:
    model = ScriptedChat(responses=responses or SCRIPT)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", lh.ToolNode())
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer or InMemorySaver())


def notes_configuration(**fields: Any):
    return AgentConfigurationFactory(tools=TOOL_NAMES, **fields)
