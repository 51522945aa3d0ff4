"""A worker told to stop hands its run back (docs/design.md §3.8).

In-process, on both databases: the stop is requested through ``shutdown`` itself (armed in the
test process, as the cluster's main process arms it), the segment hands back at its next safe
point — after a read, after a write whose fence clear was deferred, inside a read cut off after
the grace — and another segment completes the run from there, each step exactly once. The worst
gaps of the hand-back itself are crash points: the process dies inside its transaction (nothing
happened: lease expiry and the reaper, the write in doubt and settled by its check), or after
the commit before a broker outside the database got the task (the redispatch).

With real processes on PostgreSQL: SIGTERM to a ``qcluster``'s main PID while a slow read runs,
or while a webhook POST is in flight.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django_q.models import OrmQ

from agentruns import audit, tasks
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.services import dispatch, reaper, reconciliation, runs
from agentruns.services.reaper import Rule, Verdict
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.results import Outcome
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.runtime import assert_released, call, config, tool_turn
from tests.support.processes import Processes, process_env, wait_until
from tests.support.webhook_receiver import WebhookReceiver

APPROVER = ["agentruns.decide_agentrun", "playground.approve_webhooks"]


class ProcessDied(BaseException):
    """Stands for the worker vanishing at that statement: nothing in the runtime catches it."""


@pytest.fixture
def stoppable() -> Iterator[None]:
    """This process is a worker of a cluster that can be told to stop (``shutdown.arm``)."""
    shutdown.arm()
    try:
        yield
    finally:
        shutdown.disarm()


def grace(seconds: float, **more):
    return {**settings.AGENTRUNS, "STOP_GRACE_SECONDS": seconds, **more}


def enqueue(script: list, *, tools: list[str] | None = None) -> AgentRun:
    return runs.run_enqueue(
        configuration=config(tools=tools), prompt="go", options={"script": script}
    )


def row(run: AgentRun) -> AgentRun:
    return AgentRun.objects.get(pk=run.pk)


def stream(run: AgentRun) -> list[AgentRunEvent]:
    return list(AgentRunEvent.objects.filter(run_id=run.pk).order_by("sequence"))


def lease_actions(run: AgentRun) -> list[tuple[str, int]]:
    return [(e.payload["action"], e.lease_epoch) for e in stream(run) if e.kind == EventKind.LEASE]


def tool_events(run: AgentRun) -> list[tuple[str, str, int]]:
    return [
        (e.payload["name"], e.payload["outcome"], e.lease_epoch)
        for e in stream(run)
        if e.kind == EventKind.TOOL
    ]


def tasks_for(run: AgentRun) -> int:
    return sum(1 for q in OrmQ.objects.all() if q.task["args"][:1] == (str(run.uuid),))


def assert_handed_back(run: AgentRun, *, at: str) -> AgentRun:
    """Queued, unclaimed, no lease and no fence, nothing spent of the budget, the hand-back
    recorded last."""
    assert_released(run)
    back = row(run)
    assert (back.status, back.requeue_count) == (Status.QUEUED, 0)
    last = stream(run)[-1]
    assert (last.kind, last.payload) == (EventKind.LEASE, {"action": "handed_back", "at": at})
    return back


def finish(run: AgentRun) -> AgentRun:
    """Another worker (not stopping) takes the run and completes it."""
    shutdown.disarm()
    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED
    done = row(run)
    report = audit.verify(run_uuid=run.uuid)
    assert report.intact, [b.line() for b in report.broken]
    return done


# --- In-process: the safe points ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_stop_during_a_read_hands_the_run_back_after_it_and_the_next_worker_goes_on(
    stoppable, probes
):
    run = enqueue(
        [
            tool_turn(call("probe_read", value="a")),
            tool_turn(call("probe_read", value="b")),
            {"content": "done"},
        ]
    )
    probes.during = lambda entry: shutdown.request()  # the cluster got SIGTERM meanwhile

    assert tasks.process_run(str(run.uuid)) == Outcome.HANDED_BACK

    assert_handed_back(run, at="round")
    assert tool_events(run) == [("probe_read", "executed", 1)]  # the finished read is recorded
    assert tasks_for(run) == 1  # its fresh wake-up, written with the hand-back
    done = finish(run)
    assert (done.output, done.lease_epoch, done.requeue_count) == ("done", 2, 0)
    assert [e["arguments"]["value"] for e in probes.seen] == ["a", "b"]  # each read once
    assert tool_events(run) == [("probe_read", "executed", 1), ("probe_read", "executed", 2)]
    assert lease_actions(run) == [("claimed", 1), ("handed_back", 1), ("claimed", 2)]


@pytest.mark.django_db
def test_a_stop_between_two_calls_of_a_turn_hands_back_before_the_second(stoppable, probes):
    run = enqueue(
        [
            tool_turn(call("probe_read", value="a"), call("probe_read", value="b")),
            {"content": "done"},
        ]
    )
    probes.during = lambda entry: shutdown.request() if entry["arguments"]["value"] == "a" else None

    assert tasks.process_run(str(run.uuid)) == Outcome.HANDED_BACK

    assert_handed_back(run, at="call")
    assert [e["arguments"]["value"] for e in probes.seen] == ["a"]
    done = finish(run)
    assert done.output == "done"
    assert [e["arguments"]["value"] for e in probes.seen] == ["a", "b"]


@pytest.mark.django_db
def test_a_write_in_flight_finishes_and_the_hand_back_clears_its_fence(stoppable, probes):
    run = enqueue([tool_turn(call("probe_create", value="x")), {"content": "created"}])
    assert tasks.process_run(str(run.uuid)) == Outcome.AWAITING_APPROVAL
    runs.run_decide(
        run_uuid=run.uuid,
        actor=UserFactory(permissions=APPROVER),
        approved=True,
        turn_digest=row(run).pending_turn["turn_digest"],
    )
    fenced = []

    def stop_during_the_write(entry):
        fenced.append(entry["row"]["pending_effect"])
        shutdown.request()

    probes.during = stop_during_the_write
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "AGENTRUNS", grace(0))  # a write is never cut off, grace or not
        assert tasks.process_run(str(run.uuid)) == Outcome.HANDED_BACK

    assert fenced == [Effect.NON_IDEMPOTENT_WRITE]  # it ran under its fence…
    assert_handed_back(run, at="round")  # …which the hand-back cleared, with its tool event
    assert tool_events(run) == [("probe_create", "executed", 2)]
    done = finish(run)
    assert done.output == "created"
    assert len(probes.seen) == 1  # the write ran once


@pytest.mark.django_db
def test_a_slow_read_is_cut_off_after_the_grace_and_runs_again_in_the_next_segment(stoppable):
    run = enqueue([tool_turn(call("wait", seconds=600)), {"content": "waited"}], tools=["wait"])
    timer = threading.Timer(0.5, shutdown.request)  # SIGTERM arrives half a second in
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "AGENTRUNS", grace(0.2, TOOL_TIMEOUT_SECONDS=600))
        timer.start()
        started = time.monotonic()
        try:
            assert tasks.process_run(str(run.uuid)) == Outcome.HANDED_BACK
        finally:
            timer.cancel()
        interrupted_after = time.monotonic() - started

    back = assert_handed_back(run, at="read")
    assert tool_events(run) == []  # the cut-off read left nothing: it changed nothing
    assert back.loop_state["turn"]["done"] == []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "AGENTRUNS", grace(0.2, TOOL_TIMEOUT_SECONDS=0.01))
        done = finish(run)
    assert done.output == "waited"
    assert tool_events(run) == [("wait", "executed", 2)]
    print(f"\nread cut off {interrupted_after:.1f}s after the segment began (stop at 0.5s)")


@pytest.mark.django_db
def test_a_stopping_worker_claims_nothing_and_sends_the_task_again(
    stoppable, django_capture_on_commit_callbacks
):
    run = enqueue([{"content": "hi"}])
    shutdown.request()

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.process_run(str(run.uuid)) == "not claimed"

    untouched = row(run)
    assert (untouched.status, untouched.lease_epoch, untouched.claimed_by) == (Status.QUEUED, 0, "")
    assert stream(run) == []
    assert tasks_for(run) == 1


def test_outside_a_cluster_nothing_is_ever_requested():
    shutdown.disarm()
    shutdown.request()
    assert not shutdown.requested()
    with shutdown.interruptible():  # a no-op: nothing to be cut off by
        pass


def test_the_cluster_start_is_wrapped_once():
    from django_q.cluster import Cluster

    shutdown.install()
    shutdown.install()
    assert Cluster.start.leasehold_handback
    assert not getattr(Cluster.start.__wrapped__, "leasehold_handback", False)


# --- In-process: the gaps of the hand-back --------------------------------------------------------


def expire(run: AgentRun) -> None:
    AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))


@pytest.mark.django_db(transaction=True)
def test_a_worker_dying_inside_the_hand_back_leaves_the_write_in_doubt_and_its_check_settles_it(
    stoppable, webhook_receiver, monkeypatch
):
    """The worst gap: a webhook POST finished, its clear deferred to the hand-back, and the
    process dies before the hand-back's transaction commits. Nothing of it happened: the run is
    running under the dead lease with the fence stamped, the reaper parks it in doubt, the
    webhook's check finds the delivery, and the run completes — one delivery."""
    webhook_receiver.post_delay = 0.3
    monkeypatch.setattr(
        settings, "AGENTRUNS", grace(5, WEBHOOK_ALLOWLIST=[webhook_receiver.netloc])
    )
    post = {"name": "call_webhook", "arguments": {"url": webhook_receiver.url(), "payload": {}}}
    run = runs.run_enqueue(
        configuration=AgentConfigurationFactory(
            tools=[], script=[{"tool_calls": [post]}, {"content": "sent"}]
        ),
        prompt="go",
    )
    assert tasks.process_run(str(run.uuid)) == Outcome.AWAITING_APPROVAL
    runs.run_decide(
        run_uuid=run.uuid,
        actor=UserFactory(permissions=APPROVER),
        approved=True,
        turn_digest=row(run).pending_turn["turn_digest"],
    )
    watcher = threading.Thread(
        target=lambda: (
            wait_until(lambda: webhook_receiver.deliveries, timeout=30, interval=0.01),
            shutdown.request(),
        )
    )
    watcher.start()

    def dies(run_uuid: str) -> None:
        raise ProcessDied()

    monkeypatch.setattr(dispatch, "wake_with_commit", dies)
    with pytest.raises(ProcessDied):
        tasks.process_run(str(run.uuid))
    watcher.join()

    dead = row(run)
    assert (dead.status, dead.pending_effect) == (Status.RUNNING, Effect.NON_IDEMPOTENT_WRITE)
    assert "handed_back" not in [a for a, _ in lease_actions(run)]
    assert tool_events(run) == []  # the POST's event was part of the undone transaction
    expire(dead)
    [verdict] = reaper.reap_stale_runs().verdicts
    assert (verdict.rule, verdict.verdict) == (Rule.FENCE, Verdict.IN_DOUBT)
    assert reconciliation.run_check_in_doubt(run_uuid=run.uuid, attempt=1) == "landed"
    monkeypatch.undo()
    shutdown.disarm()
    assert tasks.process_run(str(run.uuid)) == Outcome.COMPLETED

    assert row(run).output == "sent"
    assert len(webhook_receiver.deliveries) == 1


@pytest.mark.django_db(transaction=True)
def test_a_hand_back_whose_wake_up_never_left_is_redispatched(stoppable, probes, monkeypatch):
    """With a broker outside the database the wake-up is sent after the hand-back commits: a
    worker dying in between leaves the run queued with no task. The redispatch sends one."""
    run = enqueue([tool_turn(call("probe_read", value="a")), {"content": "done"}])
    OrmQ.objects.all().delete()  # the enqueue's own task is long gone
    probes.during = lambda entry: shutdown.request()
    monkeypatch.setattr(dispatch, "wake_with_commit", lambda run_uuid: None)  # died: never sent

    assert tasks.process_run(str(run.uuid)) == Outcome.HANDED_BACK

    assert_handed_back(run, at="round")
    assert tasks_for(run) == 0
    monkeypatch.setattr(settings, "AGENTRUNS", grace(5, REDISPATCH_SECONDS=0.01))
    time.sleep(0.05)  # the hand-back's updated_at is in the past on the database clock
    assert reaper.reap_stale_runs().redispatched == 1
    assert tasks_for(run) == 1
    monkeypatch.undo()
    done = finish(run)
    assert (done.output, done.requeue_count) == ("done", 0)
    assert [e["arguments"]["value"] for e in probes.seen] == ["a"]


# --- Real processes: SIGTERM to a qcluster --------------------------------------------------------


def sigterm(worker) -> float:
    """SIGTERM to the cluster's main PID only (never its group); when it was sent."""
    worker.popen.send_signal(signal.SIGTERM)
    return time.monotonic()


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigterm_during_a_slow_read_releases_the_lease_before_the_worker_exits(
    processes: Processes,
):
    run = runs.run_enqueue(
        configuration=AgentConfigurationFactory(
            tools=[], script=[tool_turn(call("wait", seconds=600)), {"content": "waited"}]
        ),
        prompt="go",
    )
    # A long lease: were the run freed by its expiry, this test would wait ten minutes.
    first = processes.qcluster(
        "worker-a",
        env=process_env(
            AGENTRUNS_LEASE_SECONDS=600,
            AGENTRUNS_TOOL_TIMEOUT_SECONDS=600,
            AGENTRUNS_STOP_GRACE_SECONDS=1,
            Q_TIMEOUT=900,
            Q_RETRY=1000,
        ),
    )
    wait_until(
        lambda: (
            row(run).status == Status.RUNNING and EventKind.LLM in [e.kind for e in stream(run)]
        ),
        timeout=120,
        message="worker A to start the wait",
        procs=[first],
    )
    holder = row(run).claimed_by
    time.sleep(0.5)  # the wait has begun

    sent = sigterm(first)
    code = first.wait(timeout=120)
    stopped = time.monotonic()

    assert code == 0, first.output()[-3000:]
    back = assert_handed_back(run, at="read")  # written by the worker, so before it exited
    assert back.lease_epoch == 1 and tool_events(run) == []
    assert [e.segment for e in stream(run)][-1] == holder
    second = processes.qcluster("worker-b", env=process_env(AGENTRUNS_TOOL_TIMEOUT_SECONDS=1))
    wait_until(lambda: row(run).status == Status.COMPLETED, timeout=120, procs=[second])
    completed = time.monotonic()
    assert second.stop() == 0

    done = row(run)
    assert (done.output, done.lease_epoch, done.requeue_count) == ("waited", 2, 0)
    assert tool_events(run) == [("wait", "executed", 2)]  # once, by the next worker
    assert not [e for e in stream(run) if e.kind == EventKind.REAPER]  # no lease ran out
    print(
        f"\nSIGTERM during a read: worker exited {stopped - sent:.1f}s after the signal "
        f"(grace 1 s), the run completed {completed - stopped:.1f}s after that"
    )


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigterm_during_a_webhook_post_lets_it_finish_and_hands_the_run_back_once(
    processes: Processes,
):
    receiver = WebhookReceiver(post_delay=3).start()
    try:
        post = {"name": "call_webhook", "arguments": {"url": receiver.url(), "payload": {}}}
        run = runs.run_enqueue(
            configuration=AgentConfigurationFactory(
                tools=[], script=[{"tool_calls": [post]}, {"content": "sent"}]
            ),
            prompt="go",
        )
        env = process_env(
            AGENTRUNS_WEBHOOK_ALLOWLIST=receiver.netloc,
            AGENTRUNS_TOOL_TIMEOUT_SECONDS=30,
            AGENTRUNS_STOP_GRACE_SECONDS=0,  # a read would be cut off at once; a write never
        )
        first = processes.qcluster("worker-a", env=env)
        wait_until(
            lambda: row(run).status == Status.WAITING_FOR_APPROVAL, timeout=120, procs=[first]
        )
        runs.run_decide(
            run_uuid=run.uuid,
            actor=UserFactory(permissions=APPROVER),
            approved=True,
            turn_digest=row(run).pending_turn["turn_digest"],
        )
        wait_until(lambda: receiver.deliveries, timeout=120, message="the POST", procs=[first])
        assert row(run).pending_effect == Effect.NON_IDEMPOTENT_WRITE  # in flight, fenced

        sigterm(first)
        assert first.wait(timeout=120) == 0, first.output()[-3000:]

        assert_handed_back(run, at="round")
        assert tool_events(run) == [("call_webhook", "executed", 2)]
        second = processes.qcluster("worker-b", env=env)
        wait_until(lambda: row(run).status == Status.COMPLETED, timeout=120, procs=[second])
        assert second.stop() == 0
        assert len(receiver.deliveries) == 1
    finally:
        receiver.stop()
    assert (row(run).output, row(run).requeue_count) == ("sent", 0)
    assert not [e for e in stream(run) if e.kind == EventKind.REAPER]
