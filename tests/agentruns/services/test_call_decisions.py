"""Decisions per call (docs/design.md §5): approve, deny with a reason, answer in place of running,
on SQLite and PostgreSQL alike — what runs, what the model reads, what the events record, and
what is refused before anything changes. Edits are in ``test_call_edits.py``; races and crash
points in ``test_call_verdict_races.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from agentruns import audit, event_summaries, transitions
from agentruns.authority import VIEW_ALL_PERMISSION, call_choices
from agentruns.exceptions import (
    CallsMismatch,
    InvalidRequest,
    NotPermitted,
    SelfApprovalRefused,
    StaleTurn,
    ValueTooLong,
)
from agentruns.models import AgentRun, Effect, EventKind, Status
from agentruns.services.runs import run_decide, run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.tools import Tool, registry
from agentruns.tools.shown import shown_turn
from agentruns.turns import (
    MAX_ANSWER_CHARS,
    MAX_REASON_CHARS,
    ApprovalDecision,
    CallVerdict,
    parse_decision,
    read_pending_turn,
)
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.runtime import (
    DECIDE,
    _probe_body,
    assert_contiguous,
    assert_released,
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

GUARDED = "probe_guarded"
GUARD_PERMISSION = "agentruns.view_all_agentruns"  # any permission the plain decider lacks


def start(
    script: list[dict[str, Any]],
    *,
    tools: list[str] | None = None,
    initiator: Any = None,
    **fields: Any,
) -> AgentRun:
    result = run_start_sync(
        configuration=config(tools=tools, **fields),
        prompt="do the thing",
        initiator=initiator,
        options={"script": script},
    )
    assert result.outcome == Outcome.AWAITING_APPROVAL
    return result.run


def two_writes(**fields: Any) -> AgentRun:
    return start(
        [
            tool_turn(call("probe_write", value="good"), call("probe_create", value="bad")),
            {"content": "finished"},
        ],
        **fields,
    )


def decide(run: AgentRun, *verdicts: CallVerdict, actor: Any = None, mode: str = "inline"):
    return run_decide(
        run_uuid=run.uuid,
        actor=actor if actor is not None else decider(),
        turn_digest=run.pending_turn["turn_digest"],
        verdicts=list(verdicts),
        mode=mode,
    )


def verdict(call_id: str, name: str, **fields: Any) -> CallVerdict:
    return CallVerdict(call_id=call_id, verdict=name, **fields)  # type: ignore[arg-type]


def tool_events(run: AgentRun) -> list[dict[str, Any]]:
    return [e.payload for e in events(run) if e.kind == EventKind.TOOL]


def approval_payload(run: AgentRun) -> dict[str, Any]:
    (approval,) = [e for e in events(run) if e.kind == EventKind.APPROVAL]
    return approval.payload


# --- Verdict mixes -----------------------------------------------------------------------------


def test_approving_one_of_two_runs_only_it_and_the_other_is_denied_with_the_reason(probes):
    run = two_writes()
    reviewer = decider()
    reason = "use the staging URL instead — «not prod»"

    result = decide(
        run,
        verdict("call_0_0", "approve"),
        verdict("call_0_1", "deny", reason=reason),
        actor=reviewer,
    )

    assert result.outcome == Outcome.COMPLETED
    assert [seen["tool"] for seen in probes.seen] == ["probe_write"]
    (ran,) = probes.seen
    assert ran["row"]["pending_effect"] == Effect.IDEMPOTENT_WRITE  # fenced, as always
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert_released(run)
    assert_contiguous(run)
    denied, executed = tool_events(run)  # the denial is settled before anything runs
    assert (denied["call_id"], denied["outcome"], denied["decided_by"], denied["reason"]) == (
        "call_0_1",
        "denied",
        reviewer.get_username(),
        reason,
    )
    assert (executed["call_id"], executed["outcome"]) == ("call_0_0", "executed")
    # The model reads who denied it, and the reason verbatim as the reviewer's words.
    messages = tool_messages(sent(run)[-1])
    assert json.loads(messages["call_0_1"]) == {
        "error": f"denied by {reviewer.get_username()}: this call was not executed",
        "reason_given_by_the_reviewer": reason,
    }
    assert json.loads(messages["call_0_0"]) == {"probed": "probe_write", "value": "good"}
    # One approval event lists every call's verdict.
    payload = approval_payload(run)
    assert payload["per_call"] is True and payload["approved"] is True
    assert payload["calls"] == [
        {"id": "call_0_0", "name": "probe_write", "verdict": "approve"},
        {"id": "call_0_1", "name": "probe_create", "verdict": "deny", "reason": reason},
    ]
    assert payload["decider"] == reviewer.get_username()
    assert audit.verify(run_uuid=run.uuid).intact  # the ledger covers the verdicts


def test_an_answer_runs_nothing_stamps_no_fence_and_the_model_reads_it_as_a_persons(
    probes, monkeypatch
):
    run = two_writes()
    reviewer = decider()
    stamps: list[Any] = []
    real_stamp = transitions.run_stamp_fence
    monkeypatch.setattr(
        transitions,
        "run_stamp_fence",
        lambda *a, **k: stamps.append(k["call"]) or real_stamp(*a, **k),
    )

    result = decide(
        run,
        verdict("call_0_0", "deny"),
        verdict("call_0_1", "answer", answer={"id": 7, "note": "it already exists"}),
        actor=reviewer,
    )

    assert result.outcome == Outcome.COMPLETED
    assert probes.seen == [] and stamps == []
    denied, answered = tool_events(run)
    assert "reason" not in denied
    assert (answered["call_id"], answered["outcome"], answered["ok"]) == (
        "call_0_1",
        "answered",
        True,
    )
    assert answered["result"] == {"id": 7, "note": "it already exists"}
    messages = tool_messages(sent(run)[-1])
    assert json.loads(messages["call_0_1"]) == {
        "answered_by_a_person": reviewer.get_username(),
        "note": "a person gave this result in place of running the tool: the tool did not run",
        "result": {"id": 7, "note": "it already exists"},
    }
    # The timeline says who answered, and that it did not run.
    summary = event_summaries.summarise(EventKind.TOOL, answered)
    assert summary.endswith(f"answered by {reviewer.get_username()}, not run")
    approval = approval_payload(run)
    assert approval["approved"] is False
    assert approval["calls"][1] == {
        "id": "call_0_1",
        "name": "probe_create",
        "verdict": "answer",
        "answer": {"id": 7, "note": "it already exists"},
    }


@pytest.mark.parametrize(
    ("first", "second", "ran"),
    [
        ("approve", "approve", ["probe_write", "probe_create"]),
        ("approve", "deny", ["probe_write"]),
        ("deny", "approve", ["probe_create"]),
        ("answer", "approve", ["probe_create"]),
        ("deny", "deny", []),
        ("answer", "answer", []),
    ],
)
def test_every_verdict_mix_runs_exactly_the_approved_calls_in_the_models_order(
    probes, first, second, ran
):
    run = two_writes()

    def one(call_id: str, name: str) -> CallVerdict:
        if name == "answer":
            return verdict(call_id, name, answer=f"done {call_id}")
        if name == "deny":
            return verdict(call_id, name, reason=f"not {call_id}")
        return verdict(call_id, name)

    result = decide(run, one("call_0_0", first), one("call_0_1", second))

    assert result.outcome == Outcome.COMPLETED
    assert [seen["tool"] for seen in probes.seen] == ran
    outcomes = {p["call_id"]: p["outcome"] for p in tool_events(run)}
    words = {"approve": "executed", "deny": "denied", "answer": "answered"}
    assert outcomes == {"call_0_0": words[first], "call_0_1": words[second]}
    assert len(tool_events(run)) == 2  # each call answered to the model exactly once
    assert set(tool_messages(sent(run)[-1])) == {"call_0_0", "call_0_1"}


def test_a_whole_turn_denial_carries_its_reason_and_approved_true_still_means_all(probes):
    run = two_writes()
    reviewer = decider()

    run_decide(
        run_uuid=run.uuid,
        actor=reviewer,
        approved=False,
        reason="not today",
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )

    assert probes.seen == []
    messages = {k: json.loads(v) for k, v in tool_messages(sent(run)[-1]).items()}
    said = f"denied by {reviewer.get_username()}: this call was not executed"
    assert messages == {
        "call_0_0": {"error": said, "reason_given_by_the_reviewer": "not today"},
        "call_0_1": {"error": said, "reason_given_by_the_reviewer": "not today"},
    }
    assert approval_payload(run)["reason"] == "not today"
    assert "(reason: not today)" in event_summaries.summarise(
        EventKind.APPROVAL, approval_payload(run)
    )

    other = two_writes()
    with pytest.raises(InvalidRequest) as refused:
        run_decide(
            run_uuid=other.uuid,
            actor=reviewer,
            approved=True,
            reason="why not",
            turn_digest=other.pending_turn["turn_digest"],
        )
    assert refused.value.detail["field"] == "reason"


def test_the_stored_decision_reads_back_as_it_was_recorded(probes):
    run = two_writes()
    reviewer = decider()

    decide(
        run,
        verdict("call_0_0", "approve"),
        verdict("call_0_1", "answer", answer="done"),
        actor=reviewer,
        mode="queued",
    )

    run.refresh_from_db()
    assert run.status == Status.QUEUED
    stored = parse_decision(run.loop_state["decision"])
    assert stored == ApprovalDecision(
        approved=True,
        decider_id=reviewer.pk,
        turn_digest=stored.turn_digest,
        verdicts=(
            CallVerdict("call_0_0", "approve"),
            CallVerdict("call_0_1", "answer", answer="done"),
        ),
        decider=reviewer.get_username(),
    )


# --- Refusals: nothing changes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdicts", "error", "detail"),
    [
        ([("call_0_0", "approve", {})], CallsMismatch, {"missing": ["call_0_1"]}),
        (
            [("call_0_0", "approve", {}), ("call_0_0", "deny", {}), ("call_0_1", "deny", {})],
            CallsMismatch,
            {"duplicated": ["call_0_0"]},
        ),
        (
            [("call_0_0", "approve", {}), ("call_0_1", "deny", {}), ("call_9", "deny", {})],
            CallsMismatch,
            {"unknown": ["call_9"]},
        ),
        (
            [
                ("call_0_0", "deny", {"reason": "x" * (MAX_REASON_CHARS + 1)}),
                ("call_0_1", "deny", {}),
            ],
            ValueTooLong,
            {"field": "calls[0].reason", "limit": MAX_REASON_CHARS},
        ),
        (
            [
                ("call_0_0", "deny", {}),
                ("call_0_1", "answer", {"answer": "y" * (MAX_ANSWER_CHARS + 1)}),
            ],
            ValueTooLong,
            {"field": "calls[1].answer", "limit": MAX_ANSWER_CHARS},
        ),
        (
            [
                ("call_0_0", "deny", {}),
                ("call_0_1", "answer", {"answer": [[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]}),
            ],
            InvalidRequest,
            {"field": "calls[1].answer"},
        ),
        (
            [("call_0_0", "deny", {}), ("call_0_1", "answer", {})],
            InvalidRequest,
            {"field": "calls[1].answer"},
        ),
        (
            [("call_0_0", "approve", {"reason": "because"}), ("call_0_1", "deny", {})],
            InvalidRequest,
            {"field": "calls[0].reason"},
        ),
        (
            [("call_0_0", "deny", {"reason": "nul \x00 here"}), ("call_0_1", "deny", {})],
            InvalidRequest,
            {"field": "calls[0].reason"},
        ),
        (
            [("call_0_0", "maybe", {}), ("call_0_1", "deny", {})],
            InvalidRequest,
            {"field": "calls[0].verdict"},
        ),
        (
            [
                ("call_0_0", "edit", {"arguments": ["not", "an", "object"]}),
                ("call_0_1", "deny", {}),
            ],
            InvalidRequest,
            {"field": "calls[0].arguments"},
        ),
    ],
)
def test_a_malformed_decision_is_refused_and_changes_nothing(probes, verdicts, error, detail):
    run = two_writes()
    before = snapshot(run)

    with pytest.raises(error) as refused:
        decide(run, *(verdict(i, v, **fields) for i, v, fields in verdicts))

    for key, value in detail.items():
        assert refused.value.detail[key] == value
    assert snapshot(run) == before
    assert probes.seen == []


def test_a_stale_digest_is_refused_for_a_per_call_decision_too(probes):
    run = two_writes()
    before = snapshot(run)
    with pytest.raises(StaleTurn):
        run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            turn_digest="0" * 64,
            verdicts=[verdict("call_0_0", "approve"), verdict("call_0_1", "deny")],
        )
    with pytest.raises(InvalidRequest):  # both forms at once
        run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            turn_digest=run.pending_turn["turn_digest"],
            approved=True,
            verdicts=[verdict("call_0_0", "approve"), verdict("call_0_1", "deny")],
        )
    assert snapshot(run) == before


# --- Authority per call ------------------------------------------------------------------------


@pytest.fixture
def guarded(probes):
    tool = Tool(
        name=GUARDED,
        description="Test probe: a write whose approval needs one more permission.",
        parameters={"type": "object", "properties": {"value": {"type": "string"}}},
        effect=Effect.IDEMPOTENT_WRITE,
        func=_probe_body(GUARDED),
        approve_permission=GUARD_PERMISSION,
    )
    registry.register(tool)
    yield probes
    registry.unregister(GUARDED)


def guarded_turn() -> AgentRun:
    return start(
        [
            tool_turn(call("probe_write", value="note"), call(GUARDED, value="hook")),
            {"content": "finished"},
        ],
        tools=["probe_write", GUARDED],
    )


def test_a_reader_may_approve_one_call_and_only_deny_the_other(guarded):
    run = guarded_turn()
    plain = decider()
    pending = shown_turn(run, read_pending_turn(run))

    choices = call_choices(
        user=plain, configuration=run.configuration, pending=pending, initiator_id=run.initiator_id
    )

    assert [(c.call_id, c.verdicts) for c in choices] == [
        ("call_0_0", ("approve", "deny", "answer", "edit")),
        ("call_0_1", ("deny",)),
    ]
    assert choices[1].refusal == f"approving {GUARDED} needs {GUARD_PERMISSION}"
    before = snapshot(run)
    for refused_verdict in ("approve", "answer"):
        fields = {"answer": "x"} if refused_verdict == "answer" else {}
        with pytest.raises(NotPermitted) as refused:
            decide(
                run,
                verdict("call_0_0", "approve"),
                verdict("call_0_1", refused_verdict, **fields),
                actor=plain,
            )
        assert refused.value.detail["call_ids"] == ["call_0_1"]
        assert GUARD_PERMISSION in refused.value.message
    assert snapshot(run) == before

    result = decide(run, verdict("call_0_0", "approve"), verdict("call_0_1", "deny"), actor=plain)

    assert result.outcome == Outcome.COMPLETED
    assert [seen["tool"] for seen in guarded.seen] == ["probe_write"]
    assert approval_payload(run)["authority"]["permissions"] == [DECIDE]


def test_four_eyes_holds_per_call_the_initiator_may_deny_and_answer(probes):
    initiator = decider()
    run = two_writes(require_second_approver=True, initiator=initiator)
    choices = call_choices(
        user=initiator,
        configuration=run.configuration,
        pending=shown_turn(run, read_pending_turn(run)),
        initiator_id=run.initiator_id,
    )
    assert all(c.self_approval and not c.allows("approve") for c in choices)

    with pytest.raises(SelfApprovalRefused) as refused:
        decide(run, verdict("call_0_0", "approve"), verdict("call_0_1", "deny"), actor=initiator)
    assert refused.value.detail["call_ids"] == ["call_0_0"]

    result = decide(
        run, verdict("call_0_0", "answer", answer=1), verdict("call_0_1", "deny"), actor=initiator
    )
    assert result.outcome == Outcome.COMPLETED and probes.seen == []


# --- The API and the screens -------------------------------------------------------------------


def test_the_api_takes_a_verdict_per_call_and_refuses_with_typed_errors(client, probes):
    run = two_writes()
    reviewer = decider()
    client.force_login(reviewer)
    url = f"/api/runs/{run.uuid}/decision/"
    digest = run.pending_turn["turn_digest"]

    missing = client.post(
        url,
        {"turn_digest": digest, "calls": [{"id": "call_0_0", "verdict": "approve"}]},
        "application/json",
    )
    assert missing.status_code == 400
    assert missing.json()["code"] == "calls_mismatch" and missing.json()["missing"] == ["call_0_1"]
    long = client.post(
        url,
        {
            "turn_digest": digest,
            "calls": [
                {"id": "call_0_0", "verdict": "approve"},
                {"id": "call_0_1", "verdict": "deny", "reason": "r" * 2001},
            ],
        },
        "application/json",
    )
    assert long.status_code == 400 and long.json()["code"] == "value_too_long"

    reason = '<script>alert("x")</script> & “quotes”'
    accepted = client.post(
        url,
        {
            "turn_digest": digest,
            "mode": "inline",
            "calls": [
                {"id": "call_0_0", "verdict": "approve"},
                {"id": "call_0_1", "verdict": "deny", "reason": reason},
            ],
        },
        "application/json",
    )

    assert accepted.status_code == 200, accepted.json()
    assert accepted.json()["status"] == Status.COMPLETED
    denied = next(p for p in tool_events(run) if p["outcome"] == "denied")
    assert denied["reason"] == reason  # stored verbatim
    # … and shown escaped: the run's page in the inbox.
    reviewer_page = UserFactory(permissions=[DECIDE, VIEW_ALL_PERMISSION])
    client.force_login(reviewer_page)
    page = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert '<script>alert("x")' not in page


def test_a_member_of_the_group_the_wait_was_escalated_to_may_approve_per_call(probes):
    from django.contrib.auth.models import Group
    from django.utils import timezone

    from agentruns.authority import escalation_of

    approvers, escalation = (
        Group.objects.create(name="approvers"),
        Group.objects.create(name="leads"),
    )
    run = two_writes(approver_group=approvers)
    outsider, lead = decider(), decider()
    lead.groups.add(escalation)
    with pytest.raises(NotPermitted):
        decide(run, verdict("call_0_0", "approve"), verdict("call_0_1", "deny"), actor=outsider)
    AgentRun.objects.filter(pk=run.pk).update(escalated_to=escalation, escalated_at=timezone.now())
    run.refresh_from_db()
    choices = call_choices(
        user=lead,
        configuration=run.configuration,
        pending=shown_turn(run, read_pending_turn(run)),
        initiator_id=run.initiator_id,
        escalated_to=escalation_of(run),
    )
    assert choices[0].allows("approve")

    result = decide(run, verdict("call_0_0", "approve"), verdict("call_0_1", "deny"), actor=lead)

    assert result.outcome == Outcome.COMPLETED
    assert [seen["tool"] for seen in probes.seen] == ["probe_write"]
    assert approval_payload(run)["authority"]["group"] == "leads"
