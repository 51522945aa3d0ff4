"""The lease clock is the database's (docs/design.md §3.4, §8.1, §8.4): an app server whose clock
runs ten minutes fast must not make a live lease look stale, and one running slow must not make a
stale lease look live.

The ``fast_clock`` and ``slow_clock`` fixtures move every clock Python reads — ``time.time``,
``datetime.now`` and so ``django.utils.timezone.now`` — with time-machine (it patches the C
functions, so ``from … import now`` copies move too). The database's clock (PostgreSQL's
``STATEMENT_TIMESTAMP()``, SQLite's ``'now'``) is the machine's own and does not move.

The slips these catch: one lease comparison or deadline computed on the app server's clock — a
guard or selector written ``lease_expires__lt=timezone.now()`` (a fast clock then reaps live runs,
a slow one leaves dead runs unreaped), a deadline ``timezone.now() + LEASE_SECONDS`` (a fast clock
then grants an eleven-minute lease), an ``updated_at`` stamped by the app (a queued run's
redispatch is then early or ten minutes late), or a person's decision checked against its
approval deadline with ``approval_deadline__lt=timezone.now()`` (a slow clock then accepts an
approval past the deadline, a fast one refuses an approval in time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from agentruns import selectors
from agentruns.exceptions import ApprovalExpired
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    AgentRun,
    AgentRunEvent,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.services import reaper, runs
from agentruns.services.runtime.results import Outcome
from agentruns.transitions import (
    run_clear_fence,
    run_decide,
    run_enqueue,
    run_heartbeat,
    run_mark_in_doubt,
    run_reclaim_stale,
    run_settle,
    run_stamp_fence,
)
from agentruns.turns import ApprovalDecision, PendingTurn
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.runtime import call, config, decide_inline, tool_turn
from tests.agentruns.support.runtime import snapshot as run_snapshot
from tests.agentruns.support.transitions import (
    CALL,
    DIGEST,
    REAPER,
    WORKER,
    claim_lease,
    reaper_event,
    snapshot,
    start,
    suspend,
)

pytestmark = pytest.mark.django_db

SKEW = timedelta(minutes=10)
LEASE = timedelta(seconds=settings.AGENTRUNS["LEASE_SECONDS"])


def db_clock() -> datetime:
    """The database's clock, read with the SQL ``Now()`` compiles to."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            return cursor.fetchone()[0]
        cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
        return datetime.fromisoformat(cursor.fetchone()[0]).replace(tzinfo=UTC)


def _skewed(offset: timedelta) -> Iterator[None]:
    with time_machine.travel(datetime.now(UTC) + offset, tick=True):
        assert abs(timezone.now() - db_clock() - offset) < timedelta(seconds=30)
        assert abs(datetime.fromtimestamp(time.time(), UTC) - db_clock() - offset) < SKEW / 20
        yield


@pytest.fixture
def fast_clock() -> Iterator[None]:
    """The app server's clock ten minutes ahead of the database's."""
    yield from _skewed(SKEW)


@pytest.fixture
def slow_clock() -> Iterator[None]:
    """The app server's clock ten minutes behind the database's."""
    yield from _skewed(-SKEW)


def enqueued() -> AgentRun:
    return run_enqueue(
        configuration=AgentConfigurationFactory(),
        initiator_id=None,
        prompt="hello",
        request={"prompt": "hello"},
    )


# --- a fast app clock: live leases stay live --------------------------------------------------


def test_the_reaper_finds_nothing_to_reap_on_live_runs(fast_clock):
    """Live runs of every kind — claimed at birth, by a worker, mid non-idempotent write — with
    leases a minute long: to a clock ten minutes fast each has expired nine minutes ago."""
    born = start()
    claimed = claim_lease(run_id=enqueued().pk, identity=WORKER)
    assert claimed is not None
    fenced = start()
    assert run_stamp_fence(fenced, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    live = [born, claimed, fenced]
    before = {lease.run_id: snapshot(lease.run_id) for lease in live}

    assert list(selectors.stale_runs()) == []
    assert reaper.reap_stale_runs(dry_run=True).found == 0
    report = reaper.reap_stale_runs()
    # The reaper's guards themselves, as a reaper acting on an older read would call them.
    assert run_reclaim_stale(run_id=born.run_id, segment=REAPER, event=reaper_event()) is False
    assert (
        run_mark_in_doubt(
            run_id=fenced.run_id,
            pending_turn=PendingTurn.for_reconciliation(AgentRun.objects.get(pk=fenced.run_id)),
            segment=REAPER,
            event=reaper_event(),
        )
        is False
    )
    assert (
        run_settle(
            run_id=claimed.run_id,
            status=Status.FAILED,
            reason=TerminationReason.RETRIES_EXHAUSTED,
            stale_only=True,
            segment=REAPER,
        )
        is False
    )

    assert (report.found, report.redispatched) == (0, 0), report.verdicts
    assert {lease.run_id: snapshot(lease.run_id) for lease in live} == before
    assert not AgentRunEvent.objects.filter(kind=EventKind.REAPER).exists()
    assert all(run_heartbeat(lease) for lease in live)


def _renewing(write: Callable[[Lease], bool]) -> Callable[[], Lease | None]:
    lease = start()
    return lambda: lease if write(lease) else None


def _claiming() -> Callable[[], Lease | None]:
    run = enqueued()
    return lambda: claim_lease(run_id=run.pk, identity=WORKER)


def _deciding_inline() -> Callable[[], Lease | None]:
    lease = start()
    suspend(lease)
    return lambda: (
        run_decide(
            run_uuid=lease.uuid,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=DIGEST,
            decision=ApprovalDecision(approved=True),
            event=EventSpec(EventKind.APPROVAL, {"approved": True}),
            identity="resume:host-c:300",
        ).lease
    )


#: Each write that grants or renews a lease, through both writers (the step boundary's SQL and
#: the ORM): a function that prepares a run and returns the write, which returns the lease
#: holding the run after it.
LEASE_WRITES: dict[str, Callable[[], Callable[[], Lease | None]]] = {
    "start": lambda: start,
    "heartbeat": lambda: _renewing(lambda lease: run_heartbeat(lease, loop_state={"i": 1})),
    "stamp_fence": lambda: _renewing(
        lambda lease: run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    ),
    "clear_fence": lambda: _renewing(run_clear_fence),
    "claim": _claiming,
    "decide_inline": _deciding_inline,
}


@pytest.mark.parametrize("name", LEASE_WRITES)
def test_every_lease_deadline_is_the_database_clock_plus_the_lease(fast_clock, name):
    write = LEASE_WRITES[name]()
    before = db_clock()

    lease = write()

    after = db_clock()
    assert lease is not None
    deadline = AgentRun.objects.values_list("lease_expires", flat=True).get(pk=lease.run_id)
    assert before + LEASE <= deadline <= after + LEASE, "the deadline followed the app clock"
    assert run_heartbeat(lease)


def test_a_worker_segment_is_never_reaped_mid_call(fast_clock, probes):
    """A whole queued run through the services: a worker claims it, and while its tool runs the
    reaper passes and finds nothing; the run completes."""
    configuration = config(script=[tool_turn(call("probe_read", value="x")), {"content": "done"}])
    run = runs.run_enqueue(configuration=configuration, prompt="read it")
    reports: list[reaper.ReaperReport] = []
    probes.during = lambda entry: reports.append(reaper.reap_stale_runs(redispatch=False))

    result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == Outcome.COMPLETED, result
    assert [r.found for r in reports] == [0], [r.verdicts for r in reports]
    assert [entry["row"]["status"] for entry in probes.seen] == [Status.RUNNING]
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).exists()


def test_a_queued_run_nobody_claimed_is_redispatched_on_the_database_clock(fast_clock):
    """A queued run whose wake-up was lost gets a fresh one ``REDISPATCH_SECONDS`` after it was
    queued on the database clock — not ten minutes later."""
    configuration = AgentConfigurationFactory()
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "REDISPATCH_SECONDS": 1}):
        run = runs.run_enqueue(configuration=configuration, prompt="hello")  # wake-up never sent
        time.sleep(1.5)

        assert reaper.redispatch_unclaimed() == 1

    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).count() == 1


# --- a slow app clock: stale leases stay stale --------------------------------------------------


def test_a_lease_that_expired_on_the_database_clock_is_reaped(slow_clock):
    """Expired a second ago on the database clock; to a clock ten minutes slow it has more than
    nine minutes to run."""
    lease = start()
    AgentRun.objects.filter(pk=lease.run_id).update(lease_expires=Now() - timedelta(seconds=1))

    report = reaper.reap_stale_runs()

    assert [(v.run_uuid, v.verdict) for v in report.verdicts] == [
        (lease.uuid, reaper.Verdict.REQUEUED)
    ]
    assert AgentRun.objects.get(pk=lease.run_id).status == Status.QUEUED
    assert run_heartbeat(lease) is False


def test_a_fresh_queued_run_is_not_redispatched(slow_clock):
    """Queued a moment ago on the database clock: its wake-up is not sent again yet."""
    run = runs.run_enqueue(configuration=AgentConfigurationFactory(), prompt="hello")

    assert reaper.reap_stale_runs().redispatched == 0
    assert not AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).exists()


# --- approval deadlines are the database's too --------------------------------------------------


def waiting_with_deadline(left: timedelta) -> AgentRun:
    """A real run waiting for approval of a write, its deadline ``left`` from now on the
    database clock (negative: already past)."""
    configuration = config(
        script=[tool_turn(call("probe_create", value="x")), {"content": "done"}],
        approval_timeout=timedelta(hours=1),
    )
    result = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert result.outcome == Outcome.AWAITING_APPROVAL
    AgentRun.objects.filter(pk=result.run.pk).update(approval_deadline=Now() + left)
    return AgentRun.objects.get(pk=result.run.pk)


def test_an_approval_a_second_past_the_deadline_is_refused_on_a_slow_app_clock(slow_clock, probes):
    """Past by a second on the database clock; to a clock ten minutes slow it has almost ten
    minutes left. The approval is refused, the write never runs and the run keeps waiting for
    the deadline to settle it."""
    run = waiting_with_deadline(-timedelta(seconds=1))
    before = run_snapshot(run)

    with pytest.raises(ApprovalExpired):
        decide_inline(run)

    assert run_snapshot(run) == before, "the decision past the deadline changed the run"
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    assert probes.seen == []
    [verdict] = reaper.reap_stale_runs().expired  # the deadline's to settle
    assert verdict.run_uuid == run.uuid


def test_an_approval_with_five_minutes_left_is_accepted_on_a_fast_app_clock(fast_clock, probes):
    """Five minutes left on the database clock; to a clock ten minutes fast the deadline
    passed five minutes ago. The approval is accepted and the write runs once."""
    run = waiting_with_deadline(timedelta(minutes=5))

    result = decide_inline(run)

    assert result.outcome == Outcome.COMPLETED, result
    assert [entry["tool"] for entry in probes.seen] == ["probe_create"]
    assert not AgentRunEvent.objects.filter(run=run, payload__by="deadline").exists()
