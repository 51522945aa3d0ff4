"""Queued runs on both databases: enqueue, the worker's claim, queued decisions, failure recovery
with the retry classes and exponential backoff of docs/design.md §7.1, §7.2, and the budget shared
with the reaper. The tasks are called in-process here; real ``qcluster`` processes are in
``crashes/test_workers.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from agentruns import tasks
from agentruns.models import AgentRun, EventKind, Provider, Status
from agentruns.providers.scripted import ScriptedProvider
from agentruns.services import dispatch, reaper, runs
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.transitions import claim_lease
from tests.support.processes import ROOT

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
BACKOFF = settings.AGENTRUNS["RETRY_BACKOFF_SECONDS"]
BUDGET = settings.AGENTRUNS["MAX_REQUEUES"]


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks):
    """Run ``transaction.on_commit`` callbacks (the wake-ups) as a real commit would."""

    def capture():
        return django_capture_on_commit_callbacks(execute=True)

    return capture


def enqueue(script, *, on_commit, configuration=None, **options):
    configuration = configuration or AgentConfigurationFactory(tools=[])
    with on_commit():
        return runs.run_enqueue(
            configuration=configuration, prompt="do it", options={"script": script, **options}
        )


def wakeups(run) -> list[tuple]:
    """The immediate django-q2 tasks waiting for ``run``: (func, args, kwargs) each."""
    found = []
    for queued in OrmQ.objects.order_by("pk"):
        task = queued.task
        if task["args"] and task["args"][0] == str(run.uuid):
            found.append((task["func"], task["args"], task["kwargs"]))
    return found


def delayed_wakeups(run) -> list[Schedule]:
    return list(Schedule.objects.filter(func=dispatch.TASK, args=repr(str(run.uuid))))


def reload(run) -> AgentRun:
    run.refresh_from_db()
    return run


def expire_lease(run) -> None:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=timezone.now() - timedelta(minutes=1))


# --- Enqueue and claim -------------------------------------------------------------------------


def test_enqueue_inserts_an_unclaimed_queued_run_and_a_task_carrying_only_its_uuid(on_commit):
    run = enqueue([{"content": "hi"}], on_commit=on_commit)

    run = reload(run)
    assert run.status == Status.QUEUED
    assert (run.claimed_by, run.lease_expires, run.lease_epoch) == ("", None, 0)
    assert wakeups(run) == [(dispatch.TASK, (str(run.uuid),), {})]


def test_an_enqueue_rolled_back_sends_no_task(on_commit):
    configuration = AgentConfigurationFactory(tools=[])
    with on_commit(), pytest.raises(RuntimeError), transaction.atomic():
        runs.run_enqueue(configuration=configuration, prompt="do it")
        raise RuntimeError("the caller's transaction failed")

    assert not AgentRun.objects.exists()
    assert not OrmQ.objects.exists()


def test_the_worker_claims_with_a_worker_identity_and_a_duplicate_task_is_a_no_op(on_commit):
    run = enqueue(
        [{"tool_calls": [{"name": "list_notes"}]}, {"content": "listed"}], on_commit=on_commit
    )

    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED
    events_after_first = run.events.count()
    assert tasks.process_run(str(run.uuid)) == "not claimed"

    run = reload(run)
    assert (run.status, run.output, run.lease_epoch) == (Status.COMPLETED, "listed", 1)
    assert run.started_at is not None
    claim = run.events.order_by("sequence").first()
    assert claim.kind == EventKind.LEASE and claim.payload == {"action": "claimed"}
    assert claim.segment.startswith("worker:")
    assert {e.segment for e in run.events.all()} == {claim.segment}
    assert run.events.count() == events_after_first


@pytest.mark.parametrize("bogus", ["3f1e1c1e-0000-4000-8000-000000000000", "not-a-uuid"])
def test_a_task_for_an_unknown_run_is_a_no_op(bogus):
    assert tasks.process_run(bogus) == "not claimed"


def test_a_cancelled_queued_run_is_never_claimed(on_commit):
    run = enqueue([{"content": "hi"}], on_commit=on_commit)
    assert runs.run_cancel(run_uuid=run.uuid)

    assert tasks.process_run(str(run.uuid)) == "not claimed"
    assert reload(run).status == Status.CANCELLED


# --- Queued decisions --------------------------------------------------------------------------


def test_a_queued_decision_is_recorded_and_continued_by_a_worker(on_commit):
    note = Note.objects.create(title="t", body="old")
    run = enqueue(
        [
            {"tool_calls": [{"name": "update_note", "arguments": {"id": note.pk, "body": "new"}}]},
            {"content": "updated"},
        ],
        on_commit=on_commit,
    )
    assert tasks.process_run(str(run.uuid)) == Outcome.AWAITING_APPROVAL
    run = reload(run)
    staff = UserFactory(permissions=[DECIDE])

    with on_commit():
        result = runs.run_decide(
            run_uuid=run.uuid,
            actor=staff,
            approved=True,
            turn_digest=run.pending_turn["turn_digest"],
        )

    assert result.outcome == Outcome.QUEUED
    run = reload(run)
    assert run.status == Status.QUEUED and run.claimed_by == ""
    approval = run.events.get(kind=EventKind.APPROVAL)
    assert approval.actor == staff and approval.payload["mode"] == "queued"
    assert wakeups(run)[-1] == (dispatch.TASK, (str(run.uuid),), {})
    note.refresh_from_db()
    assert note.body == "old"  # nothing ran before a worker claimed it

    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED
    run = reload(run)
    note.refresh_from_db()
    assert (run.status, run.output, run.lease_epoch) == (Status.COMPLETED, "updated", 2)
    assert note.body == "new"
    [write] = run.events.filter(kind=EventKind.TOOL, payload__name="update_note")
    assert write.lease_epoch == 2 and write.segment.startswith("worker:")


# --- Failure recovery (docs/design.md §7.2) -------------------------------------------------------


def test_a_retryable_failure_is_requeued_with_exponential_backoff_until_the_budget(on_commit):
    run = enqueue([{"error": "retryable"}], on_commit=on_commit)

    for attempt in range(BUDGET):
        before = timezone.now()
        with on_commit():
            assert tasks.process_run(str(run.uuid)) == Outcome.REQUEUED
        run = reload(run)
        delay = BACKOFF * 2**attempt
        assert (run.status, run.requeue_count, run.claimed_by) == (Status.QUEUED, attempt + 1, "")
        assert run.error["type"] == "ProviderError:scripted"
        requeued = run.events.filter(kind=EventKind.LEASE, payload__action="requeued").last()
        assert requeued.payload["retry_in_seconds"] == delay
        schedule = delayed_wakeups(run)[-1]
        assert schedule.schedule_type == Schedule.ONCE and schedule.repeats == -1
        assert before + timedelta(seconds=delay) <= schedule.next_run
        assert schedule.next_run <= timezone.now() + timedelta(seconds=delay)

    assert tasks.process_run(str(run.uuid)) == Outcome.FAILED
    run = reload(run)
    assert (run.status, run.termination_reason) == (Status.FAILED, "retries_exhausted")
    assert len(delayed_wakeups(run)) == BUDGET


def test_a_fatal_failure_is_not_retried(on_commit):
    run = enqueue([{"error": "fatal"}], on_commit=on_commit)

    with on_commit():
        assert tasks.process_run(str(run.uuid)) == Outcome.FAILED

    run = reload(run)
    assert (run.status, run.termination_reason) == (Status.FAILED, "not_retryable")
    assert run.requeue_count == 0
    assert delayed_wakeups(run) == []


def test_a_transient_failure_recovers_on_the_retry(on_commit):
    run = enqueue([{"error": "retryable", "times": 1, "content": "fine now"}], on_commit=on_commit)
    ScriptedProvider.clear_recordings(str(run.uuid))

    with on_commit():
        assert tasks.process_run(str(run.uuid)) == Outcome.REQUEUED
    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED

    run = reload(run)
    assert (run.output, run.requeue_count, run.lease_epoch) == ("fine now", 1, 2)


@pytest.mark.parametrize(
    ("status", "outcome", "reason"),
    [
        (503, Outcome.REQUEUED, ""),
        (500, Outcome.REQUEUED, ""),
        (429, Outcome.REQUEUED, ""),
        (401, Outcome.FAILED, "not_retryable"),
        (400, Outcome.FAILED, "not_retryable"),
        (404, Outcome.FAILED, "not_retryable"),
    ],
)
def test_the_http_failure_classes_of_an_openai_compatible_provider(
    chat_server, monkeypatch, on_commit, status, outcome, reason
):
    monkeypatch.setenv("LEASEHOLD_TEST_KEY", "sk-test")
    configuration = AgentConfigurationFactory(
        provider=Provider.OPENAI,
        model="test-model",
        base_url=chat_server.base_url,
        api_key_env="LEASEHOLD_TEST_KEY",
        tools=[],
        script=[],
    )
    chat_server.fail(status)
    with on_commit():
        run = runs.run_enqueue(configuration=configuration, prompt="hi")

    with on_commit():
        assert tasks.process_run(str(run.uuid)) == outcome

    run = reload(run)
    assert run.termination_reason == reason
    assert len(delayed_wakeups(run)) == (1 if outcome == Outcome.REQUEUED else 0)


def test_failure_retries_and_stale_reclaims_share_one_budget(on_commit):
    run = enqueue([{"error": "retryable"}], on_commit=on_commit)

    with on_commit():
        assert tasks.process_run(str(run.uuid)) == Outcome.REQUEUED  # budget 1 used
    assert claim_lease(run_id=run.pk, identity="worker:crashed:1")
    expire_lease(run)  # that worker died
    assert reaper.reap_stale_runs().count(reaper.Verdict.REQUEUED) == 1  # 2 used
    with on_commit():
        assert tasks.process_run(str(run.uuid)) == Outcome.REQUEUED  # 3 used
    assert reload(run).requeue_count == 3
    requeued = run.events.filter(kind=EventKind.LEASE, payload__action="requeued").last()
    assert requeued.payload["retry_in_seconds"] == BACKOFF * 2**2
    assert claim_lease(run_id=run.pk, identity="worker:crashed:2")
    expire_lease(run)

    report = reaper.reap_stale_runs()

    assert [v.rule for v in report.verdicts] == [reaper.Rule.BUDGET]
    run = reload(run)
    assert (run.status, run.termination_reason) == (Status.FAILED, "retries_exhausted")


# --- A reclaimed run continues from its last boundary -----------------------------------------


class Crash(BaseException):
    """Stands in for the process dying: nothing in the segment catches it."""


def test_a_reclaimed_run_continues_from_its_last_boundary_not_from_the_start(
    on_commit, scripted_recordings
):
    run = enqueue(
        [
            {"tool_calls": [{"name": "list_notes"}]},
            {"tool_calls": [{"name": "wait", "arguments": {"seconds": 0}}]},
            {"content": "all done"},
        ],
        on_commit=on_commit,
    )
    lease = claim_lease(run_id=run.pk, identity="worker:doomed:1")
    llm_seen = []

    def die_after_the_second_model_turn(event):
        if event.kind == EventKind.LLM:
            llm_seen.append(event)
            if len(llm_seen) == 2:
                raise Crash()

    with pytest.raises(Crash):
        continue_segment(lease, observer=die_after_the_second_model_turn)
    assert reload(run).status == Status.RUNNING
    expire_lease(run)
    with on_commit():
        assert reaper.reap_stale_runs().count(reaper.Verdict.REQUEUED) == 1
    assert wakeups(run)[-1][1] == (str(run.uuid),)
    ScriptedProvider.clear_recordings(str(run.uuid))

    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED

    run = reload(run)
    assert (run.output, run.lease_epoch, run.requeue_count) == ("all done", 2, 1)
    # One provider call in the new segment: the third turn, with the whole dialogue before it.
    [sent] = ScriptedProvider.recorded(str(run.uuid))
    assert [m["role"] for m in sent if m["role"] != "system"] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    llm = run.events.filter(kind=EventKind.LLM).order_by("sequence")
    assert [(e.payload["iteration"], e.lease_epoch) for e in llm] == [(1, 1), (2, 1), (3, 2)]
    tools = run.events.filter(kind=EventKind.TOOL).order_by("sequence")
    assert [(e.payload["name"], e.lease_epoch) for e in tools] == [("list_notes", 1), ("wait", 2)]
    sequences = list(run.events.order_by("sequence").values_list("sequence", flat=True))
    assert sequences == list(range(len(sequences)))


# --- The broker ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, {"orm": "default"}),
        ({"Q_BROKER": "orm"}, {"orm": "default"}),
        (
            {"Q_BROKER": "redis", "REDIS_URL": "redis://10.0.0.5:6380/2"},
            {"redis": "redis://10.0.0.5:6380/2"},
        ),
    ],
)
def test_the_broker_is_chosen_by_the_environment(environment, expected):
    code = (
        "import json; from config.settings import base; "
        "print(json.dumps({k: base.Q_CLUSTER.get(k) for k in ('orm', 'redis', 'name')}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("Q_BROKER", "REDIS_URL")}
    completed = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cluster = json.loads(completed.stdout)
    assert cluster["name"] == "leasehold"
    assert {k: v for k, v in cluster.items() if k in ("orm", "redis") and v} == expected
