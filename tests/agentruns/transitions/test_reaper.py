"""The reaper's writes (docs/design.md §2.3): ``run_reclaim_stale`` and ``run_mark_in_doubt``, each
guarded by the lease being stale at the moment of the update.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agentruns.models import AgentRun, Effect, EventKind, Status
from agentruns.transitions import (
    run_clear_fence,
    run_heartbeat,
    run_mark_in_doubt,
    run_reclaim_stale,
    run_stamp_fence,
)
from agentruns.turns import Call, PendingTurn
from tests.agentruns.factories import AgentRunFactory
from tests.agentruns.support.transitions import (
    CALL,
    REAPER,
    events,
    expire,
    reaper_event,
    snapshot,
    start,
)

pytestmark = pytest.mark.django_db


# --- reclaim stale -------------------------------------------------------------------------------


def test_reclaim_stale_queues_the_run_with_budget_plus_one():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event())

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.QUEUED
    assert run.requeue_count == 1
    assert (run.claimed_by, run.lease_expires, run.pending_effect, run.pending_call) == (
        "",
        None,
        "",
        None,
    )
    assert run.lease_epoch == 1
    assert events(run.pk)[-1] == (1, EventKind.REAPER, REAPER, 0)


def test_reclaim_stale_of_a_live_lease_is_false():
    lease = start()
    before = snapshot(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is False

    assert snapshot(lease.run_id) == before
    assert len(events(lease.run_id)) == 1


def test_reclaim_stale_rechecks_staleness_in_the_update():
    """The reaper saw the run stale; the holder renewed before the reclaim: skip it."""
    lease = start()
    expire(lease.run_id)
    seen_stale = list(
        AgentRun.objects.filter(status=Status.RUNNING, lease_expires__lt=timezone.now())
    )
    assert [r.pk for r in seen_stale] == [lease.run_id]
    assert run_heartbeat(lease)
    before = snapshot(lease.run_id)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is False

    assert snapshot(lease.run_id) == before
    assert run_heartbeat(lease)


@override_settings(AGENTRUNS={"LEASE_SECONDS": 0.001})
def test_a_lease_that_has_run_out_is_stale_at_once():
    # A lease is positive (agentruns.E003 refuses 0 or less): the shortest one, then let it end.
    lease = start()
    time.sleep(0.05)

    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event())


@pytest.mark.parametrize("trait", ["waiting", "in_doubt", "completed", "cancelled"])
def test_reclaim_stale_only_touches_running_runs(trait):
    run = AgentRunFactory(**{trait: True}, lease_expires=timezone.now() - timedelta(minutes=5))
    before = snapshot(run.pk)

    assert run_reclaim_stale(run_id=run.pk, segment=REAPER, event=reaper_event()) is False

    assert snapshot(run.pk) == before


def test_reclaim_stale_of_a_queued_run_is_false():
    run = AgentRunFactory()

    assert run_reclaim_stale(run_id=run.pk, segment=REAPER, event=reaper_event()) is False
    assert AgentRun.objects.get(pk=run.pk).requeue_count == 0


# --- mark in doubt -------------------------------------------------------------------------------


IN_DOUBT_TURN = PendingTurn(
    kind="reconciliation", turn_digest="r" * 64, calls=(Call(id="call_1_0", name="create_note"),)
)


def test_mark_in_doubt_parks_a_stale_non_idempotent_write_for_a_human():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)

    assert run_mark_in_doubt(
        run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
    )

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert (run.claimed_by, run.lease_expires) == ("", None)
    assert run.pending_effect == Effect.NON_IDEMPOTENT_WRITE
    assert run.pending_call == CALL
    assert run.pending_turn == IN_DOUBT_TURN.to_json()
    assert run.requeue_count == 0
    assert events(run.pk)[-1] == (1, EventKind.REAPER, REAPER, 0)
    # The dead segment cannot clear the fence it left behind.
    assert run_clear_fence(lease) is False


@pytest.mark.parametrize("effect", ["", Effect.READ, Effect.IDEMPOTENT_WRITE])
def test_mark_in_doubt_needs_a_non_idempotent_fence(effect):
    lease = start()
    if effect:
        assert run_stamp_fence(lease, effect=effect, call=CALL)
    expire(lease.run_id)
    before = snapshot(lease.run_id)

    assert (
        run_mark_in_doubt(
            run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )

    assert snapshot(lease.run_id) == before


def test_mark_in_doubt_of_a_live_lease_is_false():
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    before = snapshot(lease.run_id)

    assert (
        run_mark_in_doubt(
            run_id=lease.run_id, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )

    assert snapshot(lease.run_id) == before


def test_mark_in_doubt_of_a_cancelled_fenced_run_is_false():
    run = AgentRunFactory(
        cancelled=True, fenced=True, lease_expires=timezone.now() - timedelta(minutes=5)
    )
    before = snapshot(run.pk)

    assert (
        run_mark_in_doubt(
            run_id=run.pk, pending_turn=IN_DOUBT_TURN, segment=REAPER, event=reaper_event()
        )
        is False
    )
    assert snapshot(run.pk) == before
