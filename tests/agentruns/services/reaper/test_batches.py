"""The reaper's set-based batch (docs/design.md §8.1) on SQLite and PostgreSQL: a constant
number of statements per batch, each run's event numbered after its own, a renewed run skipped
among taken ones, and the run-by-run fallback when the database refuses the batch.

The verdicts per rule are in ``services/reaper/test_rules.py``; races and crashes in
``crashes/test_workers.py``.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from agentruns import audit, transitions
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import dispatch, reaper
from agentruns.services.reaper import Verdict
from agentruns.services.reaper.batches import _event as batch_event
from agentruns.transitions import reaper as reaper_transitions
from agentruns.turns import PendingTurn
from tests.agentruns.factories import AgentRunFactory
from tests.agentruns.support.transitions import claim_lease

pytestmark = pytest.mark.django_db


def stale_mix(each: int) -> list[AgentRun]:
    """``each`` stale runs of every verdict: reclaimed, in doubt, out of budget, broken state."""
    runs = []
    for _ in range(each):
        runs += [
            AgentRunFactory(stale=True),
            AgentRunFactory(stale=True, fenced=True),
            AgentRunFactory(stale=True, requeue_count=settings.AGENTRUNS["MAX_REQUEUES"]),
            AgentRunFactory(stale=True, loop_state={"iteration": "broken"}),
        ]
    return runs


def statements_of_one_pass(each: int) -> list[str]:
    stale_mix(each)
    with CaptureQueriesContext(connection) as queries:
        report = reaper.reap_stale_runs(batch_size=500, redispatch=False)
    assert report.found == 4 * each
    assert report.count(Verdict.SKIPPED) == 0
    return [query["sql"] for query in queries.captured_queries]


def test_a_batch_costs_the_same_statements_whatever_its_size():
    small = statements_of_one_pass(2)
    AgentRun.objects.all().delete()
    OrmQ.objects.all().delete()
    large = statements_of_one_pass(12)

    assert len(large) == len(small)
    updates = [sql for sql in large if sql.lstrip().upper().startswith(("UPDATE", "WITH"))]
    assert len(updates) == 3  # one per verdict kind: in doubt, dead-lettered, requeued
    assert sum(AgentRunEvent._meta.db_table in sql and "INSERT" in sql for sql in large) == 1
    assert sum(OrmQ._meta.db_table in sql and "INSERT" in sql for sql in large) == 1


def test_each_event_follows_its_own_runs_last_event():
    with_history = AgentRunFactory(stale=True)
    for sequence in range(3):
        AgentRunEvent.objects.create(
            run=with_history, sequence=sequence, kind=EventKind.LEASE, payload={}
        )
    fenced_with_history = AgentRunFactory(stale=True, fenced=True)
    AgentRunEvent.objects.create(
        run=fenced_with_history, sequence=0, kind=EventKind.LEASE, payload={}
    )
    fresh = AgentRunFactory(stale=True)

    reaper.reap_stale_runs()

    def reaper_sequences(run: AgentRun) -> list[int]:
        return list(run.events.filter(kind=EventKind.REAPER).values_list("sequence", flat=True))

    assert reaper_sequences(with_history) == [3]
    assert reaper_sequences(fenced_with_history) == [1]
    assert reaper_sequences(fresh) == [0]
    event = fresh.events.get()
    assert event.segment.startswith("reaper:") and event.lease_epoch == 0


def test_a_run_renewed_meanwhile_is_skipped_while_the_rest_of_its_batch_is_taken(monkeypatch):
    renewed = AgentRunFactory(stale=True, fenced=True)
    others = stale_mix(1)
    real_rule_for = reaper.rule_for

    def renew_one(run):
        if run.pk == renewed.pk:
            AgentRun.objects.filter(pk=run.pk).update(
                lease_expires=timezone.now() + timedelta(seconds=60)
            )
        return real_rule_for(run)

    monkeypatch.setattr(reaper, "rule_for", renew_one)
    report = reaper.reap_stale_runs()

    verdicts = {v.run_uuid: v.verdict for v in report.verdicts}
    assert verdicts.pop(renewed.uuid) == Verdict.SKIPPED
    assert Verdict.SKIPPED not in verdicts.values() and len(verdicts) == len(others)
    renewed.refresh_from_db()
    assert renewed.status == Status.RUNNING
    assert not renewed.events.exists()
    assert AgentRunEvent.objects.filter(kind=EventKind.REAPER).count() == len(others)


def test_a_refused_batch_leaves_nothing_and_is_carried_out_run_by_run(monkeypatch):
    runs = stale_mix(1)

    def refused(*args, **kwargs):  # after the batch's UPDATEs ran
        raise DatabaseError("the event insert was refused")

    monkeypatch.setattr(reaper_transitions, "insert_batch_events", refused)
    report = reaper.reap_stale_runs()

    monkeypatch.undo()
    expected_statuses = [
        Status.QUEUED,
        Status.WAITING_FOR_RECONCILIATION,
        Status.FAILED,
        Status.FAILED,
    ]
    for run, status in zip(runs, expected_statuses, strict=True):
        run.refresh_from_db()
        assert run.status == status
        assert run.events.filter(kind=EventKind.REAPER).count() == 1  # no half of a batch
    assert [v.verdict for v in report.verdicts] == [
        Verdict.REQUEUED,
        Verdict.IN_DOUBT,
        Verdict.DEAD_LETTERED,
        Verdict.DEAD_LETTERED,
    ]


def test_the_batch_transition_re_checks_each_guard_in_its_update():
    fenced_but_cleared = AgentRunFactory(stale=True)  # judged fenced, but no fence now
    live = AgentRunFactory(running=True)
    settled = AgentRunFactory(completed=True)
    stale = AgentRunFactory(stale=True)

    with transaction.atomic():
        taken = transitions.runs_reap_stale(
            in_doubt={fenced_but_cleared.pk: PendingTurn.for_reconciliation(stale)},
            dead_lettered={live.pk: ("retries_exhausted", {"type": "RetriesExhausted"})},
            reclaim=[settled.pk, stale.pk],
            events={
                run.pk: batch_event(run, "reclaim", Verdict.REQUEUED, "")
                for run in (fenced_but_cleared, live, settled, stale)
            },
            segment="reaper:test:1",
        )

    assert taken == {stale.pk}
    assert list(AgentRunEvent.objects.values_list("run_id", flat=True)) == [stale.pk]
    for run, status in ((fenced_but_cleared, Status.RUNNING), (live, Status.RUNNING)):
        run.refresh_from_db()
        assert run.status == status
    stale.refresh_from_db()
    assert (stale.status, stale.requeue_count) == (Status.QUEUED, 1)


def test_batched_wake_ups_write_the_rows_the_broker_would():
    with transaction.atomic():
        dispatch.send_wakeup("one-by-one")
    with transaction.atomic(), dispatch.batched_wakeups():
        dispatch.send_wakeup("first")
        dispatch.send_wakeup("second")
        assert OrmQ.objects.count() == 1  # the two are held, not yet written

    rows = list(OrmQ.objects.order_by("id"))
    assert len(rows) == 3
    assert len({row.key for row in rows}) == 1
    tasks = [SignedPackage.loads(row.payload) for row in rows]
    assert [task["args"] for task in tasks] == [("one-by-one",), ("first",), ("second",)]
    shape = {key: value for key, value in tasks[0].items() if key not in ("id", "name", "args")}
    for task in tasks[1:]:
        assert set(task) == set(tasks[0])
        assert task["func"] == shape["func"] and task["group"] == shape["group"]
        assert "broker" not in task


def test_a_held_wake_up_is_logged_with_words_not_none(caplog):
    caplog.set_level(logging.INFO, logger="django-q")
    with transaction.atomic(), dispatch.batched_wakeups():
        dispatch.send_wakeup("first")
        dispatch.send_wakeup("second")
    enqueued = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Enqueued")]
    assert enqueued == [
        "Enqueued [leasehold] held 1 of this batch's wake-ups",
        "Enqueued [leasehold] held 2 of this batch's wake-ups",
    ]


def test_batched_wake_ups_write_nothing_when_the_block_raises():
    with pytest.raises(RuntimeError), transaction.atomic(), dispatch.batched_wakeups():
        dispatch.send_wakeup("never")
        raise RuntimeError("abandoned")

    assert not OrmQ.objects.exists()


def test_a_batch_chains_each_event_into_its_runs_ledger():
    """The set-based batch appends to each run's hash chain and writes the head with the
    verdict: the ledger verifies, and the next writer (a worker's claim) chains on from it."""
    runs = stale_mix(3)
    skipped = AgentRunFactory(stale=True)  # renewed before the batch: keeps its genesis head
    AgentRun.objects.filter(pk=skipped.pk).update(
        lease_expires=timezone.now() + timedelta(seconds=60)
    )

    reaper.reap_stale_runs(redispatch=False)

    reclaimed = runs[0]
    assert claim_lease(run_uuid=reclaimed.uuid, identity="worker:w:1")
    report = audit.verify()
    assert report.intact, [b.line() for b in report.broken]
    assert report.events == len(runs) + 1  # one reaper event each, then the claim's
    for run in runs:
        run.refresh_from_db()
        last = run.events.order_by("sequence").last()
        assert run.ledger_head == last.hash and last.prev_hash
    skipped.refresh_from_db()
    assert skipped.ledger_head == "" and not skipped.events.exists()
