"""Previews of writes (issue 12, docs/design.md §5.10): made when a turn suspends, bounded, bound
by the digest, shown everywhere, and checked again before the approved call runs."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns.models import AgentRun, Effect, EventKind, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, ToolContext, registry
from agentruns.turns import Call, Change, PendingTurn, Preview, read_pending_turn, turn_digest
from agentruns.turns.previews import CUT_MARK, MAX_CHANGES, MAX_VALUE_CHARS
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import digest

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"


@pytest.fixture
def decider(db):
    return UserFactory(username="decider", permissions=[DECIDE])


def rename(note_id: int, title: str) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "update_note", "arguments": {"id": note_id, "title": title}}]},
        {"content": "renamed"},
    ]


def start(script: list[dict[str, Any]], **config: Any) -> AgentRun:
    configuration = AgentConfigurationFactory(script=script, **config)
    result = runs.run_start_sync(configuration=configuration, prompt="p")
    assert result.outcome == Outcome.AWAITING_APPROVAL, result
    return result.run


# --- The value ---------------------------------------------------------------------------------


def test_a_preview_is_bounded_before_it_is_stored():
    made = Preview.bounded(
        {
            "summary": "many",
            "target": "t",
            "changes": [{"field": f"f{i}", "before": i, "after": "x" * 5000} for i in range(30)],
        }
    )
    assert len(made.changes) == MAX_CHANGES
    assert made.summary == "many (and 10 more changes not shown)"
    after = made.changes[0].after
    assert len(after) == MAX_VALUE_CHARS and after.endswith(CUT_MARK)
    assert made.changes[0].before == 0


@pytest.mark.parametrize(
    "bad",
    [None, "text", {"target": "t"}, {"summary": " "}, {"summary": "s", "changes": [{"x": 1}]}],
)
def test_what_is_not_a_preview_is_refused(bad):
    with pytest.raises(ValueError):
        Preview.bounded(bad)


def test_the_digest_covers_the_preview():
    call = Call(id="c", name="update_note", arguments={"id": 1, "title": "b"})
    one = Preview(summary="renames", changes=(Change("title", "a", "b"),))
    other = Preview(summary="renames", changes=(Change("title", "z", "b"),))
    assert turn_digest([replace(call, preview=one)]) != turn_digest([replace(call, preview=other)])
    assert turn_digest([replace(call, preview=one)]) != turn_digest([call])


def test_a_card_whose_preview_was_altered_is_unreadable(decider):
    note = Note.objects.create(title="Old", body="b")
    run = start(rename(note.pk, "New"))
    turn = dict(run.pending_turn)
    turn["calls"][0]["preview"]["changes"][0]["before"] = "Something harmless"
    AgentRun.objects.filter(pk=run.pk).update(pending_turn=turn)
    run.refresh_from_db()
    assert read_pending_turn(run).problem == "its digest does not match the calls it shows"


# --- Made at the suspension --------------------------------------------------------------------


def test_update_note_shows_each_field_from_before_to_after(decider, client):
    note = Note.objects.create(title="Old title", body="b")
    run = start(rename(note.pk, "New title"))

    (call,) = read_pending_turn(run).calls
    assert call.preview == Preview(
        summary=f"updates note {note.pk} ('Old title')",
        target=f"note {note.pk}",
        changes=(Change("title", "Old title", "New title"),),
    )
    client.force_login(UserFactory(username="viewer", is_staff=True, permissions=[DECIDE]))
    html = client.get("/admin/approvals/").content.decode()
    assert "What will change:" in html and "Old title" in html and "New title" in html
    assert "Checked again just before the call runs" in html


def test_a_missing_note_is_said_so():
    run = start(rename(999, "x"))
    assert read_pending_turn(run).calls[0].preview.summary == "note 999 does not exist"


class Boom(Exception):
    pass


def _tool(name: str, preview: Any) -> Tool:
    return Tool(
        name=name,
        description="A write with a test preview.",
        parameters={"type": "object", "properties": {}},
        effect=Effect.IDEMPOTENT_WRITE,
        func=lambda context, arguments: {"done": True},
        preview=preview,
    )


@pytest.fixture
def preview_tools():
    def raises(context: ToolContext, arguments: dict[str, Any]) -> Any:
        raise Boom("password=hunter2 leaked in the message")

    def slow(context: ToolContext, arguments: dict[str, Any]) -> Any:
        time.sleep(context.timeout_seconds + 0.2)
        return {"summary": "too late"}

    def writes(context: ToolContext, arguments: dict[str, Any]) -> Any:
        Note.objects.create(title="written by a preview", body="")
        return {"summary": "tried to write"}

    tools = [
        _tool("preview_raises", raises),
        _tool("preview_slow", slow),
        _tool("preview_none", lambda context, arguments: None),
        _tool("preview_writes", writes),
    ]
    for tool in tools:
        registry.register(tool)
    yield
    for tool in tools:
        registry.unregister(tool.name)


@pytest.mark.parametrize(
    ("name", "failed"),
    [
        ("preview_raises", "Boom"),
        ("preview_slow", "PreviewTimedOut"),
        ("preview_none", "ValueError"),
    ],
)
def test_a_failed_preview_is_stored_as_failed_with_its_class_only(
    preview_tools, name, failed, caplog, client
):
    fast = override_settings(AGENTRUNS={**settings.AGENTRUNS, "PREVIEW_TIMEOUT_SECONDS": 0.2})
    with fast, caplog.at_level(logging.WARNING):
        run = start([{"tool_calls": [{"name": name, "arguments": {}}]}, {"content": "ok"}])

    (call,) = read_pending_turn(run).calls
    assert call.preview == Preview(failed=failed)
    assert "hunter2" not in str(run.pending_turn) and "hunter2" not in str(run.loop_state)
    if name == "preview_raises":
        assert "hunter2" in caplog.text  # the text goes to the log only
    client.force_login(UserFactory(username="viewer", is_staff=True, permissions=[DECIDE]))
    html = client.get("/admin/approvals/").content.decode()
    assert "No preview — you are deciding without one" in html and failed in html


def test_what_a_preview_writes_is_rolled_back(preview_tools):
    run = start([{"tool_calls": [{"name": "preview_writes", "arguments": {}}]}, {"content": "ok"}])
    assert read_pending_turn(run).calls[0].preview.summary == "tried to write"
    assert not Note.objects.filter(title="written by a preview").exists()


def test_the_api_shows_a_failed_preview_by_its_class(preview_tools, decider):
    from rest_framework.test import APIClient

    run = start([{"tool_calls": [{"name": "preview_raises", "arguments": {}}]}, {"content": "ok"}])
    api = APIClient()
    api.force_authenticate(decider)
    (call,) = api.get(f"/api/runs/{run.uuid}/").json()["pending_turn"]["calls"]
    assert (call["preview"], call["preview_failed"]) == (None, "Boom")


# --- Compare-and-swap --------------------------------------------------------------------------


def test_an_approved_write_whose_preview_changed_does_not_run(decider):
    note = Note.objects.create(title="Old", body="b")
    run = start(rename(note.pk, "New"))
    approved = digest(run)
    runs.run_decide(run_uuid=run.uuid, actor=decider, approved=True, turn_digest=approved)
    Note.objects.filter(pk=note.pk).update(title="Edited meanwhile")

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.AWAITING_APPROVAL
    note.refresh_from_db()
    assert note.title == "Edited meanwhile"  # nothing ran
    (changed,) = run.events.filter(kind=EventKind.VERIFICATION)
    assert changed.payload["verdict"] == "preview_changed"
    assert changed.payload["approved_preview"]["changes"][0]["before"] == "Old"
    assert changed.payload["fresh_preview"]["changes"][0]["before"] == "Edited meanwhile"
    run.refresh_from_db()
    fresh = read_pending_turn(run)
    assert fresh.turn_digest != approved
    assert fresh.calls[0].preview.changes == (Change("title", "Edited meanwhile", "New"),)
    assert not run.events.filter(kind=EventKind.TOOL, payload__name="update_note").exists()

    # What is approved now is what runs.
    runs.run_decide(
        run_uuid=run.uuid,
        actor=decider,
        approved=True,
        turn_digest=fresh.turn_digest,
        mode="inline",
    )
    note.refresh_from_db()
    assert note.title == "New"


def test_an_unchanged_preview_lets_the_approved_write_run(decider):
    note = Note.objects.create(title="Old", body="b")
    run = start(rename(note.pk, "New"))
    result = runs.run_decide(
        run_uuid=run.uuid, actor=decider, approved=True, turn_digest=digest(run), mode="inline"
    )
    assert result.outcome == Outcome.COMPLETED
    note.refresh_from_db()
    assert note.title == "New"
    assert not run.events.filter(kind=EventKind.VERIFICATION).exists()


def test_a_snapshot_preview_is_not_checked_again(decider, client):
    note = Note.objects.create(title="Old", body="b")
    run = start(rename(note.pk, "New"), preview_is_snapshot=True)
    client.force_login(UserFactory(username="viewer", is_staff=True, permissions=[DECIDE]))
    assert "Captured when the run paused" in client.get("/admin/approvals/").content.decode()
    runs.run_decide(run_uuid=run.uuid, actor=decider, approved=True, turn_digest=digest(run))
    Note.objects.filter(pk=note.pk).update(title="Edited meanwhile")

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.COMPLETED
    note.refresh_from_db()
    assert note.title == "New"


def test_pending_turn_round_trips_with_previews():
    call = Call(
        id="c",
        name="update_note",
        arguments={"id": 1},
        effect=Effect.IDEMPOTENT_WRITE,
        detailed=True,
        preview=Preview(summary="s", target="note 1", changes=(Change("title", None, "x"),)),
    )
    built = PendingTurn.for_approval([call])
    run = AgentRun(status=Status.WAITING_FOR_APPROVAL, pending_turn=built.to_json())
    assert read_pending_turn(run) == built


def test_a_field_that_already_holds_its_approved_value_still_holds():
    """The write itself landed before (its segment died after it): an idempotent write converges,
    so the compare-and-swap lets it run again. Someone else's change does not hold."""
    approved = Preview(summary="a", target="note 1", changes=(Change("title", "Old", "New"),))
    landed = Preview(summary="b", target="note 1", changes=(Change("title", "New", "New"),))
    edited = Preview(summary="a", target="note 1", changes=(Change("title", "Other", "New"),))
    retarget = Preview(summary="a", target="note 2", changes=(Change("title", "Old", "New"),))

    assert approved.still_holds(approved) and approved.still_holds(landed)
    assert not approved.still_holds(edited)
    assert not approved.still_holds(retarget)
    assert not approved.still_holds(Preview.failure("Boom")) and not approved.still_holds(None)
    summary_only = Preview(summary="calls x on MCP server s")
    assert not summary_only.still_holds(Preview(summary="calls y on MCP server s"))
