"""The claim of a queued run as one guarded write (the statement ``claim``), and the row it hands
the segment. Private: only ``agentruns.transitions.segment_writes`` calls it.

A worker's task carries only the run's uuid. The claim is one guarded ``UPDATE`` whose ``WHERE``
pins everything its event is chained from — ``status`` queued, ``lease_epoch``,
``next_sequence`` and ``ledger_head`` — so the event's hash is computed before the statement and
the same statement writes the new head. On PostgreSQL the ``UPDATE``, the event's INSERT and the
read of the row as claimed with its configuration are one statement (data-modifying CTEs); on
SQLite two statements in one IMMEDIATE transaction.

A run that was never claimed (``lease_epoch`` 0, no events, the genesis head: a freshly queued
run, the common case) needs no read first: the guard is tried with those values at once, and
only when it matches nothing is the row read and the guard tried with what it holds.
"""

from __future__ import annotations

from uuid import UUID

from agentruns import ledger
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun
from agentruns.transitions._writer import event_rows, lease_seconds, write_with_events


class Tail:
    """What a claim's guard expects of the run, and so what its event is chained from."""

    __slots__ = ("epoch", "head", "sequence", "stored_head")

    def __init__(self, epoch: int, sequence: int, stored_head: str, run_uuid: UUID) -> None:
        self.epoch = epoch
        self.sequence = sequence
        self.stored_head = stored_head  # as the row holds it ("": never written)
        self.head = stored_head or ledger.genesis(run_uuid)  # what the next event chains from

    @classmethod
    def unclaimed(cls, run_uuid: UUID) -> Tail:
        """A run that was never claimed and has no events, as ``run_enqueue`` leaves it."""
        return cls(0, 0, ledger.genesis(run_uuid), run_uuid)


def claim(
    *,
    run_uuid: UUID,
    tail: Tail,
    identity: str,
    events: list[EventSpec],
    external_framework: str = "",
) -> tuple[Lease, AgentRun] | None:
    """Claim the run ``run_uuid`` if it is queued and its tail is ``tail``: ``running``, claimed
    by ``identity`` until the database clock plus ``LEASE_SECONDS``, epoch + 1, ``events``
    appended and chained; only a run driven by ``external_framework`` ("": Leasehold's own loop,
    docs/external.md). The lease and the row as the claim left it (with its configuration on
    PostgreSQL); ``None``: the guard matched nothing (nothing written)."""
    epoch = tail.epoch + 1
    links, head = ledger.chain(
        run_uuid=run_uuid,
        prev_hash=tail.head,
        first_sequence=tail.sequence,
        segment=identity,
        lease_epoch=epoch,
        events=events,
    )
    end = tail.sequence + len(events)
    params = {
        "uuid": run_uuid,
        "owner": identity,
        "epoch": epoch,
        "lease_seconds": lease_seconds(),
        "head": head,
        "next_sequence": end,
        "expected_epoch": tail.epoch,
        "first_sequence": tail.sequence,
        "expected_head": tail.stored_head,
        "external_framework": external_framework,
    }
    rows = event_rows(tail.sequence, (identity, epoch), events, links)
    run = write_with_events("claim", params, rows)
    if run is None:
        return None
    return Lease(run.pk, run_uuid, identity, epoch, next_sequence=end, head=head), run
