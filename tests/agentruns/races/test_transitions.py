"""Races between guarded writes, with real threads on PostgreSQL (docs/design.md §2.2, §13).

Each thread opens its own connection before meeting the others on a ``threading.Barrier``, so
the competing statements reach the server together; each closes its connection at the end.
Every race is repeated a few rounds on fresh runs. The assertions never depend on who wins:
they check that exactly one writer won and that the row and the event stream agree with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError
from django.utils import timezone

from agentruns.exceptions import AlreadyDecided
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind, Status
from agentruns.transitions import (
    run_cancel,
    run_clear_fence,
    run_decide,
    run_hand_back,
    run_heartbeat,
    run_mark_in_doubt,
    run_reclaim_stale,
    run_requeue,
    run_settle,
    run_stamp_fence,
    run_suspend,
)
from agentruns.turns import ApprovalDecision, PendingTurn
from tests.agentruns.factories import AgentRunFactory
from tests.agentruns.support.races import Outcome, race
from tests.agentruns.support.transitions import (
    CALL,
    DIGEST,
    STATE,
    approval_turn,
    claim_lease,
    expire,
    start,
)
from tests.agentruns.support.transitions import ME as HOLDER

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROUNDS = 5


def reaper_event(name: str) -> EventSpec:
    return EventSpec(EventKind.REAPER, {"reaper": name})


def winners(outcomes: list[Outcome], won: Callable[[Any], bool] = bool) -> list[int]:
    unexpected = [o.error for o in outcomes if o.error is not None]
    assert not unexpected, unexpected
    return [i for i, o in enumerate(outcomes) if won(o.value)]


# --- decisions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_sixteen_concurrent_decisions_have_exactly_one_winner(round_):
    """One decision wins; every loser is told *already decided* — never *not waiting*.

    Catches a decision that checks without the row lock (``select_for_update`` dropped from
    ``_lock_run``): losers then pass the check on the row as it was, and only the guarded UPDATE
    refuses them, as ``NotWaiting``. Under the lock each loser reads the winner's committed row,
    whose ``decided_digests`` hold the digest it sent.
    """
    lease = start()
    assert run_suspend(
        lease,
        status=Status.WAITING_FOR_APPROVAL,
        pending_turn=approval_turn(),
        loop_state=STATE,
    )

    def decision(i: int) -> Callable[[], Any]:
        inline = i % 2 == 0
        return lambda: run_decide(
            run_uuid=lease.uuid,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=DIGEST,
            decision=ApprovalDecision(approved=i % 3 != 0, decider_id=i),
            event=EventSpec(EventKind.APPROVAL, {"decider": i}),
            identity=f"resume:host-{i}:{i}" if inline else None,
        )

    outcomes = race([decision(i) for i in range(16)])

    won = [i for i, o in enumerate(outcomes) if o.error is None]
    assert len(won) == 1, outcomes
    winner = won[0]
    refusals = [o.error for i, o in enumerate(outcomes) if i != winner]
    assert all(type(e) is AlreadyDecided for e in refusals), refusals
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (
        run.loop_state["decision"]
        == ApprovalDecision(approved=winner % 3 != 0, decider_id=winner).to_json()
    )
    approvals = AgentRunEvent.objects.filter(run=run, kind=EventKind.APPROVAL)
    assert [e.payload for e in approvals] == [{"decider": winner}]
    if winner % 2 == 0:
        assert (run.status, run.claimed_by, run.lease_epoch) == (
            Status.RUNNING,
            f"resume:host-{winner}:{winner}",
            2,
        )
        assert outcomes[winner].value.lease.epoch == 2
    else:
        assert (run.status, run.claimed_by, run.lease_epoch) == (Status.QUEUED, "", 1)
        assert outcomes[winner].value.lease is None


# --- claims --------------------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_eight_workers_claim_one_queued_run_and_exactly_one_wins(round_):
    run = AgentRunFactory()

    outcomes = race(
        [
            (lambda i=i: claim_lease(run_id=run.pk, identity=f"worker:host-{i}:{i}"))
            for i in range(8)
        ]
    )

    won = winners(outcomes, lambda lease: lease is not None)
    assert len(won) == 1
    lease = outcomes[won[0]].value
    after = AgentRun.objects.get(pk=run.pk)
    assert (after.status, after.claimed_by, after.lease_epoch) == (
        Status.RUNNING,
        f"worker:host-{won[0]}:{won[0]}",
        1,
    )
    assert lease.epoch == 1
    assert list(AgentRunEvent.objects.filter(run=run).values_list("kind", "segment")) == [
        (EventKind.LEASE, lease.owner)
    ]


# --- heartbeat against the reaper ----------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS * 2))
def test_heartbeat_racing_stale_reclaims(round_):
    """Either the holder renews (and no reaper reclaims) or exactly one reaper reclaims."""
    lease = start()
    expire(lease.run_id)
    reapers = [
        (
            lambda i=i: run_reclaim_stale(
                run_id=lease.run_id, segment=f"reaper:{i}", event=reaper_event(str(i))
            )
        )
        for i in range(4)
    ]

    outcomes = race([lambda: run_heartbeat(lease, loop_state={"renewed": True}), *reapers])

    won = winners(outcomes)
    run = AgentRun.objects.get(pk=lease.run_id)
    reaper_events = AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).count()
    if 0 in won:
        assert won == [0], "a renewed lease was reclaimed"
        assert (run.status, run.claimed_by, run.requeue_count) == (Status.RUNNING, HOLDER, 0)
        assert run.lease_expires > timezone.now()
        assert run.loop_state == {"renewed": True}
        assert reaper_events == 0
    else:
        assert len(won) == 1, "an expired lease was reclaimed more than once"
        assert (run.status, run.claimed_by, run.requeue_count) == (Status.QUEUED, "", 1)
        assert run.loop_state != {"renewed": True}
        assert reaper_events == 1
        assert run_heartbeat(lease) is False


@pytest.mark.parametrize("round_", range(ROUNDS * 2))
def test_heartbeat_racing_mark_in_doubt(round_):
    """A fenced non-idempotent write whose lease just expired: its holder renews while reapers
    park it in doubt. Exactly one side wins, never both. If the heartbeat wins, the run stays
    ``running`` under its holder with its fence and no reaper event; if a reaper wins, the run
    waits for reconciliation (fence kept, claim released) and the heartbeat matched nothing.

    Catches ``run_mark_in_doubt`` deciding staleness apart from its ``UPDATE`` (check, then write
    under a guard without ``lease_expires < Now()``): a holder that renews in between keeps
    running the write while a human is asked whether it landed — and the sequential tests, which
    never renew between the check and the write, pass.
    """
    lease = start()
    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL)
    expire(lease.run_id)
    turn = PendingTurn.for_reconciliation(AgentRun.objects.get(pk=lease.run_id))
    reapers = [
        (
            lambda i=i: run_mark_in_doubt(
                run_id=lease.run_id,
                pending_turn=turn,
                segment=f"reaper:{i}",
                event=reaper_event(str(i)),
            )
        )
        for i in range(4)
    ]

    outcomes = race([lambda: run_heartbeat(lease, loop_state={"renewed": True}), *reapers])

    won = winners(outcomes)
    assert len(won) == 1, f"winners: {won} (0 is the heartbeat)"
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.pending_effect, run.pending_call) == (Effect.NON_IDEMPOTENT_WRITE, CALL)
    reaper_events = AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).count()
    if won == [0]:
        assert (run.status, run.claimed_by, run.lease_epoch) == (Status.RUNNING, HOLDER, 1)
        assert run.lease_expires > timezone.now()
        assert (run.loop_state, run.pending_turn) == ({"renewed": True}, None)
        assert reaper_events == 0
        assert run_clear_fence(lease)  # the holder still owns its write
    else:
        assert (run.status, run.claimed_by, run.lease_expires) == (
            Status.WAITING_FOR_RECONCILIATION,
            "",
            None,
        )
        assert run.pending_turn == turn.to_json()
        assert run.loop_state != {"renewed": True}
        assert reaper_events == 1
        assert run_heartbeat(lease) is False
        assert run_clear_fence(lease) is False


def test_a_renewed_lease_is_never_reclaimed():
    lease = start()
    expire(lease.run_id)
    assert run_heartbeat(lease)

    outcomes = race(
        [
            (
                lambda i=i: run_reclaim_stale(
                    run_id=lease.run_id, segment="r", event=reaper_event(str(i))
                )
            )
            for i in range(8)
        ]
    )

    assert winners(outcomes) == []
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.claimed_by, run.requeue_count) == (Status.RUNNING, HOLDER, 0)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_an_expired_lease_is_reclaimed_exactly_once(round_):
    lease = start()
    expire(lease.run_id)

    outcomes = race(
        [
            (
                lambda i=i: run_reclaim_stale(
                    run_id=lease.run_id, segment="r", event=reaper_event(str(i))
                )
            )
            for i in range(8)
        ]
    )

    assert len(winners(outcomes)) == 1
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.requeue_count) == (Status.QUEUED, 1)
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.REAPER).count() == 1


# --- the zombie ----------------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_zombie_racing_the_new_holder_writes_nothing(round_):
    old = start()
    expire(old.run_id)
    assert run_reclaim_stale(run_id=old.run_id, segment="reaper", event=reaper_event("r"))
    new = claim_lease(run_id=old.run_id, identity=HOLDER)  # same identity, newer epoch
    assert new is not None and new.epoch == 2
    events_before = AgentRunEvent.objects.filter(run_id=old.run_id).count()

    zombie = [
        lambda: run_heartbeat(old, loop_state={"by": "zombie"}, events=[EventSpec(EventKind.LLM)]),
        lambda: run_stamp_fence(old, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL),
        lambda: run_clear_fence(old, events=[EventSpec(EventKind.TOOL)]),
        lambda: (
            run_suspend(
                old,
                status=Status.WAITING_FOR_APPROVAL,
                pending_turn=approval_turn("z" * 64),
                loop_state={"by": "zombie"},
            )
            is not None
        ),  # the parked row, or None
        lambda: run_requeue(old, error={"by": "zombie"}),
        lambda: run_hand_back(old, loop_state={"by": "zombie"}),
        lambda: run_settle(
            run_id=old.run_id, lease=old, status=Status.COMPLETED, reason="completed"
        ),
    ]
    holder = [
        lambda: run_heartbeat(new, loop_state={"by": "holder"}, events=[EventSpec(EventKind.LLM)]),
        lambda: run_stamp_fence(new, effect=Effect.IDEMPOTENT_WRITE, call=CALL),
        lambda: run_heartbeat(new),
    ]

    outcomes = race([*zombie, *holder])

    assert [o.error for o in outcomes] == [None] * len(outcomes)
    assert [o.value for o in outcomes[: len(zombie)]] == [False] * len(zombie)
    assert [o.value for o in outcomes[len(zombie) :]] == [True] * len(holder)
    run = AgentRun.objects.get(pk=old.run_id)
    assert (run.status, run.claimed_by, run.lease_epoch, run.requeue_count) == (
        Status.RUNNING,
        HOLDER,
        2,
        1,
    )
    assert run.loop_state == {"by": "holder"}
    assert run.pending_effect == Effect.IDEMPOTENT_WRITE
    assert run.output == "" and run.error == {}
    new_events = AgentRunEvent.objects.filter(run=run).order_by("sequence")[events_before:]
    assert [(e.kind, e.lease_epoch) for e in new_events] == [(EventKind.LLM, 2)]
    assert run_settle(run_id=run.pk, lease=new, status=Status.COMPLETED, reason="completed")


# --- terminal is terminal ------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_concurrent_endings_keep_the_first_outcome(round_):
    lease = start()
    endings = [
        lambda: run_settle(
            run_id=lease.run_id, lease=lease, status=Status.COMPLETED, reason="completed"
        ),
        lambda: run_settle(run_id=lease.run_id, status=Status.FAILED, reason="tool_failed"),
        lambda: run_settle(run_id=lease.run_id, status=Status.FAILED, reason="not_retryable"),
        lambda: run_cancel(run_id=lease.run_id, note="a"),
        lambda: run_cancel(run_id=lease.run_id, note="b"),
        lambda: run_settle(
            run_id=lease.run_id, stale_only=True, status=Status.FAILED, reason="not_resumable"
        ),
    ]
    expected = [
        (Status.COMPLETED, "completed"),
        (Status.FAILED, "tool_failed"),
        (Status.FAILED, "not_retryable"),
        (Status.CANCELLED, "cancelled"),
        (Status.CANCELLED, "cancelled"),
        None,
    ]

    outcomes = race(endings)

    won = winners(outcomes)
    assert len(won) == 1
    assert won[0] != 5, "the reaper's settle matched a live lease"
    run = AgentRun.objects.get(pk=lease.run_id)
    assert (run.status, run.termination_reason) == expected[won[0]]
    cancels = AgentRunEvent.objects.filter(run=run, kind=EventKind.CANCEL)
    assert cancels.count() == (1 if won[0] in (3, 4) else 0)
    before = AgentRun.objects.filter(pk=run.pk).values().get()

    late = race(endings)

    assert winners(late) == []
    assert AgentRun.objects.filter(pk=run.pk).values().get() == before


# --- the event stream ----------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_concurrent_writers_of_one_sequence_have_one_winner(round_):
    run = AgentRunFactory(running=True)

    def write(i: int) -> Callable[[], Any]:
        return lambda: AgentRunEvent.objects.create(
            run=run, sequence=7, kind=EventKind.LLM, segment=f"writer-{i}"
        )

    outcomes = race([write(i) for i in range(8)])

    ok = [i for i, o in enumerate(outcomes) if o.error is None]
    assert len(ok) == 1
    failed = [o.error for i, o in enumerate(outcomes) if i != ok[0]]
    assert all(isinstance(e, IntegrityError) for e in failed), failed
    assert list(AgentRunEvent.objects.filter(run=run).values_list("segment", flat=True)) == [
        f"writer-{ok[0]}"
    ]
