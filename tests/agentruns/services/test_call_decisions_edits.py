"""Editing a call's arguments on the card (docs/design.md §5): refused against the tool's schema,
never an approval — the run gets a new card for the edited turn with a fresh digest and a fresh
preview made under a lease, the model's arguments kept beside the edit; the editor is their
author under four-eyes; the model learns with the result what a person changed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentruns import audit, event_summaries
from agentruns.authority import call_choices
from agentruns.decided_calls import approval_verdicts, decided_call
from agentruns.exceptions import InvalidArguments, SelfApprovalRefused
from agentruns.models import AgentRun, Effect, EventKind, Status
from agentruns.services.runs import run_decide, run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, ToolContext, registry
from agentruns.tools.shown import shown_turn
from agentruns.turns import CallVerdict, Change, Preview, read_pending_turn
from tests.agentruns.support.runtime import (
    _OBJECT,
    _probe_body,
    assert_contiguous,
    call,
    config,
    decider,
    events,
    sent,
    snapshot,
    tool_messages,
    tool_turn,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scripted_recordings")]

PREVIEWED = "probe_previewed"


class Previews:
    """What the previewed probe's preview saw: the run row and the arguments, per preview."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, context: ToolContext, arguments: dict[str, Any]) -> Preview:
        row = AgentRun.objects.values("status", "claimed_by").get(uuid=context.run_uuid)
        self.seen.append({"row": row, "arguments": dict(arguments)})
        return Preview(
            summary=f"sets the title to {arguments.get('value')!r}",
            changes=(Change(field="title", before="old", after=arguments.get("value")),),
        )


@pytest.fixture
def previews(probes) -> Iterator[Previews]:
    made = Previews()
    registry.register(
        Tool(
            name=PREVIEWED,
            description="Test probe: an idempotent write with a preview.",
            parameters=_OBJECT,
            effect=Effect.IDEMPOTENT_WRITE,
            func=_probe_body(PREVIEWED),
            preview=made,
        )
    )
    yield made
    registry.unregister(PREVIEWED)


def waiting(initiator: Any = None, **fields: Any) -> AgentRun:
    result = run_start_sync(
        configuration=config(tools=[PREVIEWED, "probe_write", "probe_create"], **fields),
        prompt="rename the stand-up",
        initiator=initiator,
        options={
            "script": [
                tool_turn(call(PREVIEWED, value="Stand-pu"), call("probe_write", value="ok")),
                {"content": "renamed"},
            ]
        },
    )
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def decide(run: AgentRun, actor: Any, *verdicts: CallVerdict, mode: str = "inline"):
    run.refresh_from_db()
    return run_decide(
        run_uuid=run.uuid,
        actor=actor,
        turn_digest=run.pending_turn["turn_digest"],
        verdicts=list(verdicts),
        mode=mode,
    )


def edit(value: Any) -> CallVerdict:
    return CallVerdict("call_0_0", "edit", arguments={"value": value})


def approve(call_id: str = "call_0_1") -> CallVerdict:
    return CallVerdict(call_id, "approve")


def test_an_edit_that_breaks_the_schema_is_refused_naming_the_field(previews):
    run = waiting()
    before = snapshot(run)

    with pytest.raises(InvalidArguments) as refused:
        decide(run, decider(), edit(5), approve())

    assert refused.value.status == 422
    assert refused.value.detail["call_id"] == "call_0_0"
    assert refused.value.detail["field"] == "value"
    assert refused.value.errors[0].path == ("value",)
    with pytest.raises(InvalidArguments) as extra:
        decide(
            run,
            decider(),
            CallVerdict("call_0_0", "edit", arguments={"value": "x", "extra": 1}),
            approve(),
        )
    assert extra.value.detail["call_id"] == "call_0_0"
    assert snapshot(run) == before


def test_the_api_answers_an_invalid_edit_with_422_naming_the_field(client, previews):
    run = waiting()
    client.force_login(decider())
    response = client.post(
        f"/api/runs/{run.uuid}/decision/",
        {
            "turn_digest": run.pending_turn["turn_digest"],
            "calls": [
                {"id": "call_0_0", "verdict": "edit", "arguments": {"value": ["no"]}},
                {"id": "call_0_1", "verdict": "approve"},
            ],
        },
        "application/json",
    )
    assert response.status_code == 422
    body = response.json()
    assert (body["code"], body["call_id"], body["field"]) == (
        "invalid_arguments",
        "call_0_0",
        "value",
    )


def test_an_edit_runs_nothing_and_gives_the_run_a_new_card_with_a_fresh_preview(previews, probes):
    initiator, editor = decider(), decider()
    run = waiting(initiator=initiator, require_second_approver=True)
    old_digest = run.pending_turn["turn_digest"]
    assert [p["arguments"] for p in previews.seen] == [{"value": "Stand-pu"}]

    result = decide(run, editor, edit("Stand-up"), approve())

    assert result.outcome == Outcome.AWAITING_APPROVAL
    assert probes.seen == []  # nothing ran, not even the approved call
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
    pending = shown_turn(run, read_pending_turn(run))
    assert pending.turn_digest != old_digest
    edited, kept = pending.calls
    assert edited.arguments == {"value": "Stand-up"}
    assert edited.edit is not None
    assert (edited.edit.original_arguments, edited.edit.editor, edited.edit.editor_id) == (
        {"value": "Stand-pu"},
        editor.get_username(),
        editor.pk,
    )
    assert kept.id == "call_0_1" and kept.edit is None  # the approved call waits again too
    # A fresh preview of the edited arguments, made under the continuing segment's lease.
    fresh = previews.seen[-1]
    assert fresh["arguments"] == {"value": "Stand-up"}
    assert fresh["row"]["status"] == Status.RUNNING
    assert fresh["row"]["claimed_by"].startswith("resume:")
    assert edited.preview is not None and "Stand-up" in edited.preview.summary
    # The edit's event records both arguments and who edited.
    (approval,) = [e for e in events(run) if e.kind == EventKind.APPROVAL]
    assert approval.payload["editor"] == editor.get_username()
    assert approval.payload["calls"][0] == {
        "id": "call_0_0",
        "name": PREVIEWED,
        "verdict": "edit",
        "arguments": {"value": "Stand-up"},
        "original_arguments": {"value": "Stand-pu"},
    }
    shown = approval_verdicts(approval.payload)
    assert (shown[0].verdict, shown[0].by, shown[0].edited) == ("edit", editor.get_username(), True)

    # Four-eyes: the editor is the arguments' author — someone else must approve them.
    choices = call_choices(
        user=editor,
        configuration=run.configuration,
        pending=pending,
        initiator_id=run.initiator_id,
    )
    assert choices[0].self_approval and not choices[0].allows("approve")
    assert choices[1].allows("approve")
    before = snapshot(run)
    with pytest.raises(SelfApprovalRefused):
        run_decide(
            run_uuid=run.uuid,
            actor=editor,
            approved=True,
            turn_digest=pending.turn_digest,
            mode="inline",
        )
    with pytest.raises(SelfApprovalRefused) as per_call:
        decide(run, editor, CallVerdict("call_0_0", "approve"), approve())
    assert per_call.value.detail["call_ids"] == ["call_0_0"]
    assert snapshot(run) == before

    approver = decider()
    done = run_decide(
        run_uuid=run.uuid,
        actor=approver,
        approved=True,
        turn_digest=pending.turn_digest,
        mode="inline",
    )

    assert done.outcome == Outcome.COMPLETED
    assert [(s["tool"], s["arguments"]) for s in probes.seen] == [
        (PREVIEWED, {"value": "Stand-up"}),
        ("probe_write", {"value": "ok"}),
    ]
    assert_contiguous(run)
    # The model proposed "Stand-pu" and learns, with the result, what a person ran instead.
    messages = tool_messages(sent(run)[-1])
    assert json.loads(messages["call_0_0"]) == {
        "arguments_edited_by_a_person": editor.get_username(),
        "note": "a person changed this call's arguments before it ran; it ran with arguments_run",
        "arguments_run": {"value": "Stand-up"},
        "result": {"probed": PREVIEWED, "value": "Stand-up"},
    }
    llm = next(e for e in events(run) if e.kind == EventKind.LLM)
    assert llm.payload["tool_calls"][0]["arguments"] == {"value": "Stand-pu"}
    ran = next(
        e.payload
        for e in events(run)
        if e.kind == EventKind.TOOL and e.payload["call_id"] == "call_0_0"
    )
    assert ran["arguments"] == {"value": "Stand-up"}
    assert ran["edit"]["original_arguments"] == {"value": "Stand-pu"}
    assert ran["edit"]["editor"] == editor.get_username()
    shown_call = decided_call(ran)
    assert shown_call is not None and shown_call.verdict == "edited"
    assert shown_call.original_arguments == {"value": "Stand-pu"}
    summary = event_summaries.summarise(EventKind.TOOL, ran)
    assert f"ran (arguments edited by {editor.get_username()})" in summary
    assert audit.verify(run_uuid=run.uuid).intact


def test_denials_and_answers_beside_an_edit_take_effect_and_a_second_edit_keeps_the_original(
    previews, probes
):
    run = waiting()
    first, second = decider(), decider()

    decide(run, first, edit("Stand-u"), CallVerdict("call_0_1", "answer", answer="already ok"))
    run.refresh_from_db()
    assert [c["id"] for c in run.pending_turn["calls"]] == ["call_0_0"]  # the answer settled
    decide(run, second, edit("Stand-up"))

    run.refresh_from_db()
    (edited,) = shown_turn(run, read_pending_turn(run)).calls
    assert edited.arguments == {"value": "Stand-up"}
    assert edited.edit is not None
    assert edited.edit.original_arguments == {
        "value": "Stand-pu"
    }  # the model's, not the first edit
    assert edited.edit.editor == second.get_username()
    assert probes.seen == []
    answered = [
        e.payload
        for e in events(run)
        if e.kind == EventKind.TOOL and e.payload["outcome"] == "answered"
    ]
    assert [a["call_id"] for a in answered] == ["call_0_1"]
