"""In-doubt writes that settle themselves (issue 13 §1): a tool's ``check`` asked by a task, its
verdict applied like a person's, unknown answers retried and then left to a person with the
answer on the card. Deterministic crash points in-process, on SQLite and PostgreSQL alike (the
same with real processes: ``crashes/test_reconciliation.py``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import dispatch, reaper, reconciliation, runs
from agentruns.services.runtime import tool_step
from agentruns.tools import (
    CheckAnswer,
    CheckContext,
    OutcomeUnknown,
    ToolContext,
    registry,
    tool,
)
from agentruns.tools.registry import ToolDefinitionError
from playground.models import Note
from playground.tools import check_call_webhook
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.api import card_digest

# Real commits: the check tasks are sent after commit, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

DECIDE = "agentruns.decide_agentrun"
NOTE = {"name": "create_note", "arguments": {"title": "t", "body": "b"}}


class SegmentDied(BaseException):
    """The process dying: not an ``Exception``, so nothing in the loop catches it."""


def row(run: AgentRun) -> AgentRun:
    return AgentRun.objects.get(pk=run.pk)


def events(run: AgentRun, kind: str | None = None) -> list[AgentRunEvent]:
    queryset = AgentRunEvent.objects.filter(run=run).order_by("sequence")
    return list(queryset.filter(kind=kind) if kind else queryset)


def check_tasks() -> list[tuple]:
    """The check tasks sent now (ORM broker) and scheduled later: ``(args, delayed)``."""
    sent = [
        (tuple(q.task["args"]), False)
        for q in OrmQ.objects.all()
        if q.task["func"] == dispatch.CHECK_TASK
    ]
    later = [(s.args, True) for s in Schedule.objects.filter(func=dispatch.CHECK_TASK)]
    return sent + later


def queued_for_approval(script: list[dict[str, Any]]) -> AgentRun:
    """A queued run whose worker pauses it for approval of its first turn, then approved."""
    configuration = AgentConfigurationFactory(tools=[], script=script)
    run = runs.run_enqueue(configuration=configuration, prompt="go")
    runs.run_process_queued(run_uuid=run.uuid)
    waiting = row(run)
    assert waiting.status == Status.WAITING_FOR_APPROVAL
    runs.run_decide(
        run_uuid=run.uuid,
        actor=UserFactory(permissions=[DECIDE, "playground.approve_webhooks"]),
        approved=True,
        turn_digest=card_digest(waiting),
        mode="queued",
    )
    return run


def die_in_the_call(monkeypatch, run: AgentRun, *, after_the_write: bool) -> None:
    """The worker dies inside the write (before or after its effect committed); its lease runs
    out and the reaper parks the run in doubt."""
    real = tool_step.invoke_tool

    def dying(tool, arguments, context, **options):
        if after_the_write:
            real(tool, arguments, context, **options)
        raise SegmentDied()

    with monkeypatch.context() as patch:
        patch.setattr(tool_step, "invoke_tool", dying)
        with pytest.raises(SegmentDied):
            runs.run_process_queued(run_uuid=run.uuid)
    assert row(run).pending_effect == Effect.NON_IDEMPOTENT_WRITE
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=timezone.now() - timedelta(minutes=5))
    reaper.reap_stale_runs(redispatch=False)
    assert row(run).status == Status.WAITING_FOR_RECONCILIATION


def nobody_decided(run: AgentRun) -> None:
    assert not [e for e in events(run) if e.kind == EventKind.RECONCILIATION and e.actor_id]


# --- create_note: the key on the note ------------------------------------------------------------


def test_a_note_written_before_the_worker_died_is_found_and_the_run_completes(monkeypatch):
    run = queued_for_approval([{"tool_calls": [NOTE]}, {"content": "noted"}])
    die_in_the_call(monkeypatch, run, after_the_write=True)

    parked = row(run)
    assert parked.pending_turn["check"]["state"] == "scheduled"
    assert check_tasks() == [((str(run.uuid), 1), False)]
    assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "landed"
    assert row(run).status == Status.QUEUED
    runs.run_process_queued(run_uuid=run.uuid)

    done = row(run)
    assert (done.status, done.output) == (Status.COMPLETED, "noted")
    [note] = Note.objects.all()
    [verdict] = events(run, EventKind.RECONCILIATION)
    assert verdict.payload["by"] == "check" and verdict.actor_id is None
    assert verdict.payload["verdict"] == "landed"
    assert verdict.payload["evidence"] == f"note {note.pk} carries the key {run.uuid}:call_0_0"
    [reconciled] = [e for e in events(run, EventKind.TOOL)]
    assert reconciled.payload["outcome"] == "reconciled_landed"
    assert reconciled.payload["result"]["result"]["id"] == note.pk  # the model sees the note
    assert '"by": "check"' in reconciled.payload["content"]
    nobody_decided(run)


def test_a_note_never_written_is_not_landed_and_the_repeated_call_waits_for_approval(
    monkeypatch,
):
    run = queued_for_approval([{"tool_calls": [NOTE]}, {"tool_calls": [NOTE]}, {"content": "x"}])
    die_in_the_call(monkeypatch, run, after_the_write=False)

    assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "not_landed"
    runs.run_process_queued(run_uuid=run.uuid)

    again = row(run)
    assert again.status == Status.WAITING_FOR_APPROVAL  # a new call, a new card
    assert again.pending_turn["calls"][0]["id"] != "call_0_0"
    assert Note.objects.count() == 0
    [reconciled] = events(run, EventKind.TOOL)
    assert reconciled.payload["outcome"] == "reconciled_not_landed"
    nobody_decided(run)


def test_a_person_who_decides_first_wins_and_the_check_does_nothing(monkeypatch):
    run = queued_for_approval([{"tool_calls": [NOTE]}, {"content": "noted"}])
    die_in_the_call(monkeypatch, run, after_the_write=True)
    person = UserFactory(permissions=[DECIDE])
    runs.run_reconcile(
        run_uuid=run.uuid,
        actor=person,
        verdict="landed",
        turn_digest=card_digest(run),
    )

    assert (
        reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1)
        == reconciliation.DECIDED_ELSEWHERE
    )
    [verdict] = events(run, EventKind.RECONCILIATION)
    assert (verdict.actor_id, verdict.payload["by"]) == (person.pk, "person")
    assert events(run, EventKind.CHECK) == []


def test_a_duplicate_task_checks_once():
    with scripted_check(["unknown", "not_landed"]) as run:
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1).startswith("unknown")
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "nothing to check"
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=3) == "nothing to check"
        assert len(SEEN) == 1


# --- A tool whose check cannot tell ---------------------------------------------------------------

ANSWERS: list[str] = []
SEEN: list[CheckContext] = []


def _flaky_check(context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
    SEEN.append(context)
    answer = ANSWERS.pop(0)
    if answer == "error":
        raise ConnectionError("the ledger service is down")
    if answer == "timeout":
        time.sleep(0.3)
        return CheckAnswer.unknown("late")
    if answer == "write":
        Note.objects.create(title="written by a check")
        return CheckAnswer.landed("wrote")
    return CheckAnswer(answer, evidence=f"said {answer}", result={"seen": answer})


def _flaky_write(context: ToolContext, arguments: dict[str, Any]) -> Any:
    raise OutcomeUnknown("the connection closed after the request was sent")


FLAKY = tool(
    name="flaky_write",
    description="A write whose outcome is never known; its check answers from a script.",
    effect=Effect.NON_IDEMPOTENT_WRITE,
    check=_flaky_check,
)(_flaky_write)


class scripted_check:
    """A run parked in doubt by ``flaky_write`` (``OutcomeUnknown``), whose check will answer
    ``answers`` in turn."""

    def __init__(self, answers: list[str], **conf: Any) -> None:
        self.answers = answers
        self.conf = {**settings.AGENTRUNS, "RETRY_BACKOFF_SECONDS": 7, **conf}

    def __enter__(self) -> AgentRun:
        ANSWERS[:] = self.answers
        SEEN.clear()
        registry.register(FLAKY)
        self.settings = override_settings(AGENTRUNS=self.conf)
        self.settings.enable()
        call = {"name": "flaky_write", "arguments": {}}
        run = queued_for_approval([{"tool_calls": [call]}, {"content": "after"}])
        runs.run_process_queued(run_uuid=run.uuid)
        assert row(run).status == Status.WAITING_FOR_RECONCILIATION
        return run

    def __exit__(self, *exc: Any) -> None:
        self.settings.disable()
        registry.unregister(FLAKY.name)


@pytest.fixture
def inbox_client(client):
    client.force_login(UserFactory(is_staff=True, permissions=[DECIDE]))
    return client


def test_unknown_an_error_and_a_timeout_are_retried_with_backoff_then_left_to_a_person(
    inbox_client,
):
    with scripted_check(
        ["unknown", "error", "timeout"], TOOL_TIMEOUT_SECONDS=0.1, RECONCILE_CHECKS=3
    ) as run:
        assert check_tasks() == [((str(run.uuid), 1), False)]
        OrmQ.objects.all().delete()
        context = None
        for attempt, (answer, delay) in enumerate([("unknown", 7), ("error", 14)], start=1):
            assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=attempt) == (
                f"{answer}: retrying"
            )
            check = row(run).pending_turn["check"]
            assert (check["state"], check["attempts"], check["answer"]) == (
                "retrying",
                attempt,
                answer,
            )
            [(args, delayed)] = check_tasks()
            assert (args, delayed) == (f"'{run.uuid}', {attempt + 1}", True)
            due = Schedule.objects.get(func=dispatch.CHECK_TASK).next_run
            assert timedelta(seconds=delay - 2) < due - timezone.now() <= timedelta(seconds=delay)
            Schedule.objects.all().delete()
            context = SEEN[-1]
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=3) == (
            "timeout: left to a person"
        )
        assert check_tasks() == []
        waiting = row(run)
        check = waiting.pending_turn["check"]
        assert (check["state"], check["answer"], check["next_at"]) == (
            "left_to_person",
            "timeout",
            None,
        )
        assert check["evidence"] == "the check took longer than 0.1 s"
        assert [e.payload["answer"] for e in events(run, EventKind.CHECK)] == [
            "unknown",
            "error",
            "timeout",
        ]
        assert events(run, EventKind.CHECK)[1].payload["evidence"] == (
            "ConnectionError: the ledger service is down"
        )
        # What the check saw: the call's key and the token it was sent with.
        assert context is not None and context.idempotency_key.startswith(f"{run.uuid}:")
        assert context.fencing_token == waiting.pending_turn["lease_epoch"]
        assert context.name == "flaky_write" and context.attempt == 2

        page = inbox_client.get("/admin/approvals/?kind=reconciliation").content.decode()
        assert "The automatic check could not tell: decide yourself." in page
        assert "What the check answered" in page and "the check took longer than 0.1 s" in page
        api = inbox_client.get(f"/api/runs/{run.uuid}/").json()
        assert api["pending_turn"]["check"]["state"] == "left_to_person"
        assert api["pending_turn"]["check"]["answer"] == "timeout"

        # A person decides; the run goes on.
        runs.run_reconcile(
            run_uuid=run.uuid,
            actor=UserFactory(permissions=[DECIDE]),
            verdict="landed",
            turn_digest=card_digest(waiting),
        )
        runs.run_process_queued(run_uuid=run.uuid)
        assert row(run).status == Status.COMPLETED


def test_the_card_says_a_check_is_running_and_a_person_may_still_decide(inbox_client):
    with scripted_check(["unknown"]) as run:
        page = inbox_client.get("/admin/approvals/").content.decode()
        assert "An automatic check will ask the downstream system" in page
        assert "It landed" in page  # the person's buttons stay
        reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1)
        page = inbox_client.get(f"/admin/approvals/runs/{run.uuid}/").content.decode()
        assert "The automatic check could not tell; it asks again at" in page
        assert "said unknown" in page
        assert "Automatic check 1: unknown (said unknown)" in page  # the timeline


def test_a_landed_check_gives_the_model_its_result():
    with scripted_check(["landed"]) as run:
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "landed"
        runs.run_process_queued(run_uuid=run.uuid)
        [reconciled] = events(run, EventKind.TOOL)
        assert reconciled.payload["result"]["result"] == {"seen": "landed"}
        assert row(run).status == Status.COMPLETED


def test_a_check_cannot_write():
    with scripted_check(["write"], RECONCILE_CHECKS=1) as run:
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == (
            "error: left to a person"
        )
        assert Note.objects.count() == 0
        assert row(run).status == Status.WAITING_FOR_RECONCILIATION


def test_a_verdict_the_run_cannot_take_is_left_to_a_person_with_the_reason():
    with scripted_check(["landed"]) as run:
        AgentRun.objects.get(pk=run.pk).configuration.__class__.objects.filter(
            pk=run.configuration_id
        ).update(is_active=False)
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == (
            "refused: left to a person"
        )
        check = row(run).pending_turn["check"]
        assert check["state"] == "left_to_person"
        assert (
            "it answered landed (said landed), but its configuration was deactivated"
            in (check["evidence"])
        )


def test_checks_off_leave_every_in_doubt_run_to_a_person():
    with scripted_check(["landed"], RECONCILE_CHECKS=0) as run:
        assert "check" not in row(run).pending_turn
        assert check_tasks() == []
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "nothing to check"


# --- Declaring a check ---------------------------------------------------------------------------


def test_only_a_non_idempotent_write_may_declare_a_check():
    with pytest.raises(ToolDefinitionError, match="only a non_idempotent_write"):
        tool(name="r", description="d", effect=Effect.READ, check=_flaky_check)(_flaky_write)
    with pytest.raises(ToolDefinitionError, match="check is not callable"):
        tool(name="w", description="d", effect=Effect.NON_IDEMPOTENT_WRITE, check="no")(
            _flaky_write
        )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a check answers one of"):
        CheckAnswer("maybe")


def test_the_samples_declare_checks_and_mcp_tools_have_none():
    assert registry.get("create_note").check is not None
    assert registry.get("call_webhook").check is not None
    assert registry.get("update_note").check is None


@pytest.fixture(autouse=True)
def _clean_answers() -> Iterator[None]:
    yield
    ANSWERS.clear()
    SEEN.clear()


# --- call_webhook: the status protocol against a real local receiver ------------------------------


def webhook_in_doubt(receiver, **conf: Any) -> tuple[AgentRun, override_settings]:
    """A webhook run approved inline whose POST the receiver holds past the tool timeout: the
    outcome is unknown and the run is parked in doubt."""
    allowed = override_settings(
        AGENTRUNS={
            **settings.AGENTRUNS,
            "WEBHOOK_ALLOWLIST": [receiver.netloc],
            "TOOL_TIMEOUT_SECONDS": 0.5,
            **conf,
        }
    )
    allowed.enable()
    call = {"name": "call_webhook", "arguments": {"url": receiver.url(), "payload": {"n": 1}}}
    configuration = AgentConfigurationFactory(
        tools=[], script=[{"tool_calls": [call]}, {"content": "sent"}]
    )
    started = runs.run_start_sync(configuration=configuration, prompt="go")
    runs.run_decide(
        run_uuid=started.run.uuid,
        actor=UserFactory(permissions=[DECIDE, "playground.approve_webhooks"]),
        approved=True,
        turn_digest=card_digest(started.run),
        mode="inline",
    )
    run = row(started.run)
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_turn["reason"].startswith("outcome unknown")
    return run, allowed


def test_a_receiver_that_implements_the_get_settles_the_run_with_one_delivery(webhook_receiver):
    run, allowed = webhook_in_doubt(webhook_receiver)
    try:
        assert check_tasks() == [((str(run.uuid), 1), False)]
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "landed"
        runs.run_process_queued(run_uuid=run.uuid)
    finally:
        allowed.disable()
    assert row(run).status == Status.COMPLETED
    [delivery] = webhook_receiver.deliveries
    key = f"{run.uuid}:call_0_0"
    assert delivery.key == key
    [(header, query, token)] = webhook_receiver.questions
    assert (header, query, token) == (key, key, delivery.fencing_token)
    [verdict] = events(run, EventKind.RECONCILIATION)
    assert verdict.payload["by"] == "check"
    assert verdict.payload["evidence"] == 'GET answered {"landed": true}'
    nobody_decided(run)
    client = Client()
    client.force_login(UserFactory(is_staff=True, permissions=[DECIDE]))
    timeline = client.get(f"/admin/approvals/runs/{run.uuid}/").content.decode()
    assert "Reconciled by the automatic check: the call took effect" in timeline
    assert "the automatic check" in timeline


def test_a_receiver_that_answers_500_leaves_the_run_to_a_person_with_the_answer(
    webhook_receiver, inbox_client
):
    webhook_receiver.get_status = 500
    run, allowed = webhook_in_doubt(webhook_receiver, RECONCILE_CHECKS=1)
    try:
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == (
            "unknown: left to a person"
        )
    finally:
        allowed.disable()
    waiting = row(run)
    assert waiting.status == Status.WAITING_FOR_RECONCILIATION
    assert waiting.pending_turn["check"]["evidence"] == "GET answered 500: internal error"
    assert len(webhook_receiver.deliveries) == 1
    page = inbox_client.get(f"/admin/approvals/runs/{run.uuid}/").content.decode()
    assert "GET answered 500: internal error" in page
    assert "decide yourself" in page


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"not json", "GET answered 200 without JSON: not json"),
        (b'{"landed": "yes"}', 'GET answered 200 without {"landed": true|false}'),
    ],
)
def test_anything_but_the_protocol_is_unknown(http_recorder, answer, expected):
    http_recorder.respond_with(200, answer)
    context = CheckContext(
        run_uuid=uuid.uuid4(),
        call_id="c",
        initiator_id=None,
        fencing_token=1,
        timeout_seconds=2,
    )
    with override_settings(
        AGENTRUNS={**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [http_recorder.netloc]}
    ):
        found = check_call_webhook(context, {"url": http_recorder.url("/hook?a=1")})
    assert (found.verdict, found.evidence.startswith(expected)) == ("unknown", True)
    [asked] = http_recorder.requests
    assert asked.method == "GET"
    assert asked.path == f"/hook?a=1&idempotency_key={context.run_uuid}%3Ac"
    # A host no longer allowed is not asked at all.
    gone = check_call_webhook(context, {"url": http_recorder.url()})
    assert gone.verdict == "unknown" and gone.evidence.startswith("not asked:")
    assert len(http_recorder.requests) == 1


# --- A check that stalls --------------------------------------------------------------------------


def test_the_reaper_resends_a_lost_check_and_restarts_one_whose_worker_died():
    with scripted_check(["unknown", "landed"]) as run:
        OrmQ.objects.all().delete()  # the task was lost
        assert reaper.reap_stale_runs().checks_redispatched == 0  # not due yet
        AgentRun.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(hours=1))
        report = reaper.reap_stale_runs()
        assert report.checks_redispatched == 1
        assert "1 lost check(s) of in-doubt runs" in report.summary()
        assert check_tasks() == [((str(run.uuid), 1), False)]
        OrmQ.objects.all().delete()

        # A worker starts attempt 1 and dies mid-check: the card says checking.
        assert reconciliation._start(run.uuid, 1) is not None
        assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "nothing to check"
        stored = row(run).pending_turn
        assert stored["check"]["state"] == "checking"
        long_ago = (timezone.now() - timedelta(hours=1)).isoformat()
        stored["check"]["started_at"] = long_ago
        AgentRun.objects.filter(pk=run.pk).update(
            pending_turn=stored, updated_at=timezone.now() - timedelta(hours=1)
        )
        assert reaper.reap_stale_runs().checks_redispatched == 1
        assert check_tasks() == [((str(run.uuid), 1), False)]  # the same attempt again
        assert (
            reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "unknown: retrying"
        )
        assert len(SEEN) == 1
