"""Database errors inside a guarded write (docs/design.md §2.2): a constraint or sequence collision
becomes ``StateWriteFailed`` and the whole transition rolls back.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status, TerminationReason
from agentruns.transitions import run_heartbeat, run_settle, run_start
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.transitions import ME, events, snapshot, start

pytestmark = pytest.mark.django_db


# --- database errors -----------------------------------------------------------------------------


def test_a_check_constraint_violation_becomes_state_write_failed_and_rolls_back():
    lease = start()
    before, before_events = snapshot(lease.run_id), events(lease.run_id)

    with pytest.raises(StateWriteFailed) as caught:
        run_settle(
            run_id=lease.run_id,
            lease=lease,
            status=Status.COMPLETED,
            reason=TerminationReason.COMPLETED,
            totals={"prompt_tokens": -1},
            events=[EventSpec(EventKind.LLM)],
        )

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert caught.value.detail == {"transition": "run_settle"}
    assert caught.value.code == "state_write_failed"
    assert snapshot(lease.run_id) == before
    assert events(lease.run_id) == before_events
    assert lease.next_sequence == 1


def test_an_event_sequence_collision_rolls_back_the_guarded_update():
    """A segment whose event counter fell behind: the insert fails, so the UPDATE is undone."""
    lease = start()
    AgentRunEvent.objects.create(run_id=lease.run_id, sequence=1, kind=EventKind.TOOL)
    before = snapshot(lease.run_id)

    with pytest.raises(StateWriteFailed) as caught:
        run_heartbeat(lease, loop_state={"iteration": 9}, events=[EventSpec(EventKind.LLM)])

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert caught.value.detail == {"transition": "run_heartbeat"}
    assert snapshot(lease.run_id) == before
    assert lease.next_sequence == 1


@pytest.mark.django_db(transaction=True)
def test_a_foreign_key_violation_at_birth_becomes_state_write_failed():
    """Foreign keys are checked at commit (deferred): the transition's own transaction fails."""
    config = AgentConfigurationFactory()
    count = AgentRun.objects.count()

    with pytest.raises(StateWriteFailed) as caught:
        run_start(
            configuration=config,
            initiator_id=987654,
            prompt="p",
            request={},
            identity=ME,
        )

    assert isinstance(caught.value.__cause__, IntegrityError)
    assert AgentRun.objects.count() == count
