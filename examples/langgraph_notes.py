"""A LangGraph notes assistant under Leasehold: its write approved in the inbox, its process killed
mid-write, the run reaped, reconciled in the inbox and finished — the note saved exactly once.

    .venv/bin/python examples/langgraph_notes.py

Runs against the project's database (by default the SQLite file next to manage.py; set
DATABASE_URL for another), migrating it first. No network: the model is langchain-core's fake
chat model playing a script. The graph's checkpoints live in a SQLite file of their own
(langgraph-checkpoint-sqlite), so a second process continues the thread.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
# A short lease, so the reaper notices the killed process within seconds.
os.environ.setdefault("AGENTRUNS_LEASE_SECONDS", "2")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import IntegrityError, connections, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool as lc_tool  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from agentruns.audit import verify  # noqa: E402
from agentruns.event_summaries import summarise  # noqa: E402
from agentruns.external import langgraph as lh  # noqa: E402
from agentruns.models import AgentConfiguration, AgentRun, Effect  # noqa: E402
from agentruns.services import reaper  # noqa: E402
from agentruns.tools import CheckAnswer, CheckContext, ToolContext  # noqa: E402
from agentruns.tools.shown import shown_turn  # noqa: E402
from agentruns.turns import Change, Preview, read_pending_turn  # noqa: E402
from playground.models import Note  # noqa: E402

CHECKPOINTS = Path(tempfile.gettempdir()) / "leasehold-langgraph-notes.sqlite3"
KILL_MID_WRITE = "LEASEHOLD_EXAMPLE_KILL_MID_WRITE"

# --- The tools: LangChain tools, declared to Leasehold with their effects ----------------------


@lc_tool
def search_notes(query: str) -> list[dict[str, Any]]:
    """Find notes whose title contains the query."""
    return [{"id": n.pk, "title": n.title} for n in Note.objects.filter(title__icontains=query)]


@lc_tool
def save_note(title: str, body: str) -> dict[str, Any]:
    """Save a new note."""
    context = lh.call_context()
    key = context.idempotency_key if context is not None else None
    try:
        with transaction.atomic():
            note = Note.objects.create(title=title, body=body, idempotency_key=key)
    except IntegrityError:
        return {"error": "a note with this key exists already"}
    if os.environ.get(KILL_MID_WRITE):  # the note landed; the process dies before it says so
        os.kill(os.getpid(), signal.SIGKILL)
    return {"id": note.pk, "title": note.title}


def preview_save(context: ToolContext, arguments: dict[str, Any]) -> Preview:
    return Preview(
        summary=f"saves a note titled {arguments.get('title')!r}",
        changes=(
            Change(field="title", after=arguments.get("title")),
            Change(field="body", after=arguments.get("body")),
        ),
    )


def check_save(context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
    note = Note.objects.filter(idempotency_key=context.idempotency_key).first()
    if note is None:
        return CheckAnswer.not_landed(f"no note carries {context.idempotency_key}")
    return CheckAnswer.landed(f"note {note.pk} carries the key", result={"id": note.pk})


lh.leasehold_tool(search_notes, effect=Effect.READ)
lh.leasehold_tool(
    save_note, effect=Effect.NON_IDEMPOTENT_WRITE, preview=preview_save, check=check_save
)

# --- The graph: a scripted model, Leasehold's tool node -------------------------------------


class ScriptedChat(FakeMessagesListChatModel):
    """langchain-core's fake model, answering ``responses[n]`` for a conversation holding ``n``
    answers already (so a resumed thread gets the same answer as the first process would)."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        answered = sum(isinstance(m, AIMessage) for m in messages)
        message = self.responses[min(answered, len(self.responses) - 1)]
        return ChatResult(generations=[ChatGeneration(message=message.model_copy())])


def script(title: str, body: str) -> list[AIMessage]:
    call = {"id": f"save-{title}", "name": "save_note", "args": {"title": title, "body": body}}
    return [
        AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}]),
        AIMessage(content=f"I saved the note {title!r}."),
    ]


def build_graph(responses: list[AIMessage]) -> Any:
    model = ScriptedChat(responses=responses)

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
    saver = SqliteSaver(sqlite3.connect(CHECKPOINTS, check_same_thread=False))
    return builder.compile(checkpointer=saver)


# --- People, the configuration, the inbox -----------------------------------------------------


def setup() -> tuple[User, User]:
    call_command("migrate", verbosity=0)
    AgentConfiguration.objects.update_or_create(
        slug="langgraph-notes",
        defaults={"name": "LangGraph notes", "tools": ["search_notes", "save_note"]},
    )
    ana, _ = User.objects.get_or_create(username="ana", defaults={"is_staff": True})
    ben, _ = User.objects.get_or_create(username="ben", defaults={"is_staff": True})
    ben.user_permissions.add(Permission.objects.get(codename="decide_agentrun"))
    return ana, ben


def inbox(person: User) -> Client:
    client = Client(SERVER_NAME="localhost")
    client.force_login(person)
    return client


def approve_in_inbox(client: Client, result: lh.Result) -> None:
    assert result.card is not None
    page = client.get(reverse("approvals:run", kwargs={"run_uuid": result.run_uuid}))
    assert page.status_code == 200 and b"save_note" in page.content
    client.post(
        reverse("approvals:decide", kwargs={"run_uuid": result.run_uuid}),
        {"decision": "approve", "turn_digest": result.card.turn_digest},
    )


def reconcile_in_inbox(client: Client, run_uuid: str, verdict: str) -> None:
    page = client.get(reverse("approvals:run", kwargs={"run_uuid": run_uuid}))
    assert page.status_code == 200 and b"save_note" in page.content
    run = AgentRun.objects.get(uuid=run_uuid)
    digest = shown_turn(run, read_pending_turn(run)).turn_digest  # the digest the card sends
    client.post(
        reverse("approvals:reconcile", kwargs={"run_uuid": run_uuid}),
        {"verdict": verdict, "turn_digest": digest},
    )


def timeline(run_uuid: str) -> None:
    run = AgentRun.objects.get(uuid=run_uuid)
    for event in run.events.order_by("sequence"):
        print(f"    {event.sequence:>2} {event.kind:<15} {summarise(event.kind, event.payload)}")
    report = verify(run_uuid=run_uuid)
    print(f"    ledger: {report.events} events, {'verified' if not report.broken else 'BROKEN'}")


def resume_in_a_process_that_dies(run_uuid: str, responses: list[AIMessage]) -> int:
    """Resume the run in a child process killed (SIGKILL) right after its note was inserted."""
    connections.close_all()
    child = multiprocessing.get_context("fork").Process(
        target=_die_while_saving, args=(run_uuid, responses)
    )
    child.start()
    child.join(60)
    return child.exitcode if child.exitcode is not None else 0


def _die_while_saving(run_uuid: str, responses: list[AIMessage]) -> None:
    os.environ[KILL_MID_WRITE] = "1"
    lh.resume(build_graph(responses), run_uuid)


def main() -> int:
    ana, ben = setup()
    CHECKPOINTS.unlink(missing_ok=True)
    client = inbox(ben)

    print("1. ana asks; the graph proposes save_note, which waits in the inbox")
    first = script("groceries", "eggs, milk")
    graph = build_graph(first)
    started = lh.start(
        graph, configuration="langgraph-notes", prompt="note groceries", initiator=ana
    )
    kind = started.card.kind if started.card else "-"
    print(f"   run {started.run_uuid}: {started.status}, card {kind}")
    approve_in_inbox(client, started)
    done = lh.resume(graph, started.run_uuid)
    print(
        f"   ben approved in the inbox; the worker resumed the thread: {done.status}: {done.output}"
    )
    timeline(done.run_uuid)

    print("2. a second note: approved, then its process is killed mid-write")
    second = script("dentist", "tuesday 9:00")
    graph = build_graph(second)
    started = lh.start(
        graph, configuration="langgraph-notes", prompt="note the dentist", initiator=ana
    )
    approve_in_inbox(client, started)
    code = resume_in_a_process_that_dies(started.run_uuid, second)
    print(f"   the worker process died (exit {code}) after inserting the note")
    time.sleep(float(os.environ["AGENTRUNS_LEASE_SECONDS"]) + 1)
    report = reaper.reap_stale_runs()
    status = AgentRun.objects.get(uuid=started.run_uuid).status
    print(f"   the reaper: {report.summary()} -> {status}")
    reconcile_in_inbox(client, started.run_uuid, "landed")
    done = lh.resume(graph, started.run_uuid)
    print(f"   ben said it landed; resumed without saving again: {done.status}: {done.output}")
    timeline(done.run_uuid)
    saved = Note.objects.filter(title="dentist").count()
    print(f"3. notes titled 'dentist': {saved} (exactly once)")
    return 0 if saved == 1 and done.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
