"""The LangGraph adapter with the real packages (a fake model, no network), on both databases:
the approval round trip through ``interrupt`` and ``Command(resume=…)``, a denial whose reason
reaches the model, a crash mid-write reaped, in doubt and reconciled, and replays and forks of a
thread that never run a write again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from langchain_core.messages import ToolMessage

from agentruns import external
from agentruns.audit import verify
from agentruns.external import langgraph as lh
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import reaper
from agentruns.services.decisions import run_decide, run_reconcile
from playground.models import Note
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.langgraph_notes import (
    SAVE,
    build_graph,
    during_save,
    notes_configuration,
    notes_tools,  # noqa: F401 - the fixture
    saves,
)
from tests.agentruns.support.runtime import decider

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("notes_tools")]


def row(result: lh.Result) -> AgentRun:
    return AgentRun.objects.get(uuid=result.run_uuid)


def tool_messages(graph, result: lh.Result) -> list[ToolMessage]:
    values = graph.get_state({"configurable": {"thread_id": result.thread_id}}).values
    return [m for m in values["messages"] if isinstance(m, ToolMessage)]


def approve(result: lh.Result, **fields) -> None:
    run_decide(
        run_uuid=result.run_uuid,
        actor=decider(**fields),
        approved=True,
        turn_digest=result.card.turn_digest,
    )


def ledger_verifies(result: lh.Result) -> bool:
    report = verify(run_uuid=result.run_uuid)
    return report.runs == 1 and not report.broken


def test_a_write_interrupts_the_graph_with_the_card_and_runs_once_after_the_inbox_approves():
    graph = build_graph()
    started = lh.start(graph, configuration=notes_configuration(), prompt="remember eggs")
    assert started.status == "paused" and started.card.kind == "approval"
    [shown] = started.card.calls
    assert shown["name"] == "save_note" and shown["preview"]["summary"].startswith("saves")
    config = {"configurable": {"thread_id": started.thread_id}}
    [interrupted] = graph.get_state(config).interrupts
    assert interrupted.value["turn_digest"] == started.card.turn_digest
    assert row(started).status == Status.WAITING_FOR_APPROVAL and not saves
    approve(started)
    [resumed] = lh.resume_all(graph)
    assert resumed.status == "completed" and resumed.output == "Saved your note."
    assert len(saves) == 1 and Note.objects.count() == 1
    [message] = tool_messages(graph, resumed)
    assert '"title": "groceries"' in message.content
    settled = row(resumed)
    assert settled.status == Status.COMPLETED and settled.external_framework == "langgraph"
    assert ledger_verifies(resumed)


def test_a_denial_reaches_the_model_with_its_reason_and_nothing_is_saved():
    graph = build_graph()
    started = lh.start(graph, configuration=notes_configuration(), prompt="remember eggs")
    run_decide(
        run_uuid=started.run_uuid,
        actor=decider(username="carol"),
        approved=False,
        reason="we have eggs",
        turn_digest=started.card.turn_digest,
    )
    resumed = lh.resume(graph, started.run_uuid)
    assert resumed.status == "completed" and not saves and Note.objects.count() == 0
    [message] = tool_messages(graph, resumed)
    assert "we have eggs" in message.content and "carol" in message.content
    assert ledger_verifies(resumed)


def test_a_replay_and_a_fork_of_the_thread_return_the_recorded_result_and_save_nothing():
    graph = build_graph()
    started = lh.start(graph, configuration=notes_configuration(), prompt="remember eggs")
    approve(started)
    done = lh.resume(graph, started.run_uuid)
    assert done.status == "completed" and len(saves) == 1
    config = {"configurable": {"thread_id": done.thread_id}}
    before_tools = next(s for s in graph.get_state_history(config) if s.next == ("tools",))
    replayed = graph.invoke(None, before_tools.config, durability="sync")
    forked_config = graph.update_state(before_tools.config, None)
    forked = graph.invoke(None, forked_config, durability="sync")
    assert len(saves) == 1 and Note.objects.count() == 1
    for values in (replayed, forked):
        [message] = [m for m in values["messages"] if isinstance(m, ToolMessage)]
        assert '"title": "groceries"' in message.content
    # A call never recorded does not run without a holding: fail closed.
    other = external.ProposedCall("call_new", "save_note", {"title": "x", "body": "y"})
    assert external.recorded(done.run_uuid, other) is None


def test_a_process_that_dies_mid_write_is_reaped_in_doubt_reconciled_and_never_saves_twice():
    graph = build_graph()
    started = lh.start(graph, configuration=notes_configuration(), prompt="remember eggs")
    approve(started)

    def die() -> None:
        during_save.clear()
        Note.objects.create(title="groceries", body="eggs", idempotency_key=saves[-1]["key"])
        raise ProcessDied

    during_save.append(die)
    with pytest.raises(ProcessDied):
        lh.resume(graph, started.run_uuid)
    stuck = row(started)
    assert stuck.status == Status.RUNNING and stuck.pending_effect == "non_idempotent_write"
    AgentRun.objects.filter(pk=stuck.pk).update(lease_expires=Now() - timedelta(seconds=5))
    reaper.reap_stale_runs()
    in_doubt = row(started)
    assert in_doubt.status == Status.WAITING_FOR_RECONCILIATION
    run_reconcile(
        run_uuid=started.run_uuid,
        actor=decider(),
        verdict="landed",
        turn_digest=card_digest(in_doubt),
    )
    resumed = lh.resume(graph, started.run_uuid)
    assert resumed.status == "completed"
    assert len(saves) == 1 and Note.objects.count() == 1
    [message] = tool_messages(graph, resumed)
    assert "confirmed this call took effect" in message.content
    outcomes = [e.payload.get("outcome") for e in row(resumed).events.filter(kind=EventKind.TOOL)]
    assert outcomes == ["reconciled_landed"]
    assert ledger_verifies(resumed)


def test_a_call_id_of_the_framework_is_the_key_with_the_arguments():
    graph = build_graph()
    started = lh.start(graph, configuration=notes_configuration(), prompt="remember eggs")
    approve(started)
    lh.resume(graph, started.run_uuid)
    assert saves[0]["key"] == f"{started.run_uuid}:{SAVE[0]}"
