"""A run's birth and its claims (docs/design.md §2.3): ``run_start``, ``run_enqueue``,
``run_claim_queued_row`` — what each sets, and each "0 rows" case of its guard.

A refused write must change nothing: the tests compare the whole row (and the event stream)
before and after.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agentruns.models import AgentRun, EventKind, Status
from agentruns.transitions import run_cancel, run_enqueue, run_requeue
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory
from tests.agentruns.support.transitions import ME, WORKER, claim_lease, events, snapshot, start

pytestmark = pytest.mark.django_db


# --- start and enqueue ---------------------------------------------------------------------------


def test_start_claims_at_birth_with_epoch_one_and_a_lease_event_at_sequence_zero():
    before = timezone.now()

    lease = start()

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.status == Status.RUNNING
    assert run.claimed_by == ME
    assert run.lease_epoch == 1
    assert run.lease_expires > before + timedelta(seconds=30)
    assert run.started_at is not None
    assert run.uuid == lease.uuid
    assert (lease.owner, lease.epoch, lease.next_sequence) == (ME, 1, 1)
    assert events(run.pk) == [(0, EventKind.LEASE, ME, 1)]


@override_settings(AGENTRUNS={"LEASE_SECONDS": 600})
def test_lease_length_is_read_from_settings_at_call_time():
    lease = start()

    assert AgentRun.objects.get(pk=lease.run_id).lease_expires > timezone.now() + timedelta(
        seconds=500
    )


def test_enqueue_inserts_a_queued_run_with_no_claim_and_no_event():
    run = run_enqueue(
        configuration=AgentConfigurationFactory(),
        initiator_id=UserFactory().pk,
        prompt="later",
        request={"prompt": "later"},
    )

    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == Status.QUEUED
    assert (run.claimed_by, run.lease_expires, run.lease_epoch) == ("", None, 0)
    assert run.started_at is None
    assert run.request == {"prompt": "later"}
    assert events(run.pk) == []


# --- claim queued --------------------------------------------------------------------------------


def test_claim_queued_takes_the_run_with_epoch_plus_one():
    run = AgentRunFactory()

    lease = claim_lease(run_id=run.pk, identity=WORKER)

    assert lease is not None
    assert (lease.run_id, lease.uuid, lease.owner, lease.epoch) == (run.pk, run.uuid, WORKER, 1)
    after = AgentRun.objects.get(pk=run.pk)
    assert after.status == Status.RUNNING
    assert after.claimed_by == WORKER
    assert after.lease_epoch == 1
    assert after.lease_expires > timezone.now()
    assert after.started_at is not None
    assert events(run.pk) == [(0, EventKind.LEASE, WORKER, 1)]
    assert lease.next_sequence == 1


def test_second_claim_of_the_same_run_gets_none():
    run = AgentRunFactory()
    assert claim_lease(run_id=run.pk, identity=WORKER) is not None
    before = snapshot(run.pk)

    assert claim_lease(run_id=run.pk, identity="worker:other:2") is None

    assert snapshot(run.pk) == before
    assert len(events(run.pk)) == 1


@pytest.mark.parametrize(
    "trait", ["running", "waiting", "waiting_for_input", "in_doubt", "completed", "cancelled"]
)
def test_claim_queued_refuses_a_run_that_is_not_queued(trait):
    run = AgentRunFactory(**{trait: True})
    before = snapshot(run.pk)

    assert claim_lease(run_id=run.pk, identity=WORKER) is None

    assert snapshot(run.pk) == before
    assert events(run.pk) == []


def test_claim_queued_of_a_cancelled_queued_run_gets_none():
    run = AgentRunFactory()
    assert run_cancel(run_id=run.pk)

    assert claim_lease(run_id=run.pk, identity=WORKER) is None
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED


def test_claim_queued_of_a_missing_run_gets_none():
    assert claim_lease(run_id=987654, identity=WORKER) is None


def test_claim_queued_by_uuid_takes_the_same_run_as_by_id():
    run, other = AgentRunFactory(), AgentRunFactory()

    lease = claim_lease(run_uuid=str(run.uuid), identity=WORKER)

    assert lease is not None
    assert (lease.run_id, lease.uuid, lease.epoch, lease.next_sequence) == (run.pk, run.uuid, 1, 1)
    assert AgentRun.objects.get(pk=run.pk).status == Status.RUNNING
    assert AgentRun.objects.get(pk=other.pk).status == Status.QUEUED
    assert claim_lease(run_uuid=run.uuid, identity="worker:other:2") is None


@pytest.mark.parametrize("named", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", ""])
def test_claim_queued_by_a_uuid_of_no_run_gets_none(named):
    AgentRunFactory()

    assert claim_lease(run_uuid=named, identity=WORKER) is None
    assert AgentRun.objects.filter(status=Status.QUEUED).count() == 1


def test_claim_queued_needs_exactly_one_name():
    with pytest.raises(ValueError, match="run_id or by run_uuid"):
        claim_lease(identity=WORKER)


def test_claim_after_requeue_bumps_the_epoch_keeps_started_at_and_continues_the_sequence():
    run = AgentRunFactory()
    first = claim_lease(run_id=run.pk, identity=WORKER)
    started_at = AgentRun.objects.get(pk=run.pk).started_at
    assert run_requeue(first, error={"type": "Timeout"})

    second = claim_lease(run_id=run.pk, identity=WORKER)

    assert second is not None and second.epoch == 2
    after = AgentRun.objects.get(pk=run.pk)
    assert after.started_at == started_at
    assert after.requeue_count == 1
    assert events(run.pk) == [(0, EventKind.LEASE, WORKER, 1), (1, EventKind.LEASE, WORKER, 2)]
