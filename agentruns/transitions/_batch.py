"""The set-based writes behind the reaper's batch transitions (docs/design.md §8.1). Private:
only ``agentruns.transitions.reaper`` calls it.

* ``batch_write`` — one named guarded statement (``reap_in_doubt``, ``reap_failed``,
  ``reap_reclaim``) for many runs, each run's own values in ``%(runs)s``; the ids it returns are
  the runs it took (its verdict).
* ``chain_batch_events`` / ``insert_batch_events`` — one event for each of many runs, numbered
  after each run's last event and chained from its ledger head, in one INSERT; the new heads go
  into the verdict's ``UPDATE``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Max

from agentruns import ledger
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent
from agentruns.transitions._writer import append_events, event_row, execute


def batch_write(statement: str, runs: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """Execute the named batch ``statement`` for the runs keyed in ``runs`` (each one's own
    values: plain JSON values, a JSON column's as its text, ``_writer.json_text``); the ids of
    the runs it took. The guard is checked in the ``UPDATE`` itself, row by row: an id missing
    from the result did not match it, and nothing was written to that run."""
    if not runs:
        return set()
    rows = [{"id": run_id, **values} for run_id, values in runs.items()]
    _, taken = execute(statement, {"runs": json.dumps(rows, ensure_ascii=False)})
    return {row[0] for row in taken}


def next_sequences(run_ids: Sequence[int]) -> dict[int, int]:
    """Each run's next free event sequence, in one grouped read. Call only while holding the
    runs' rows (their lock or a guarded ``UPDATE`` that took them)."""
    last = dict(
        AgentRunEvent.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(last=Max("sequence"))
        .values_list("run_id", "last")
    )
    return {run_id: 0 if last.get(run_id) is None else last[run_id] + 1 for run_id in run_ids}


@dataclass(frozen=True)
class BatchChain:
    """Where each run's one new event of a batch goes: its sequence, its link in the run's
    ledger chain (``agentruns.ledger``) and the run's head after it."""

    sequences: dict[int, int]
    links: dict[int, ledger.Link]
    heads: dict[int, str]


def chain_batch_events(events: Mapping[int, EventSpec], *, segment: str, epoch: int) -> BatchChain:
    """Number and chain one event for each run keyed in ``events`` (two grouped reads: the last
    sequences, and the uuids, heads and counters). Call only while holding the runs' rows,
    before the ``UPDATE`` that writes the heads and the counters (``BatchChain.tails``) with the
    verdict."""
    run_ids = list(events)
    sequences = next_sequences(run_ids)
    stored = {}
    for run_id, run_uuid, head, counter in AgentRun.objects.filter(pk__in=run_ids).values_list(
        "pk", "uuid", ledger.HEAD_FIELD, ledger.SEQUENCE_FIELD
    ):
        stored[run_id] = (run_uuid, head or ledger.genesis(run_uuid))
        # The run's counter, unless its events say it is behind (the reaper heals it).
        sequences[run_id] = max(sequences[run_id], counter)
    links: dict[int, ledger.Link] = {}
    heads: dict[int, str] = {}
    for run_id, spec in events.items():
        run_uuid, prev = stored[run_id]
        [link], heads[run_id] = ledger.chain(
            run_uuid=run_uuid,
            prev_hash=prev,
            first_sequence=sequences[run_id],
            segment=segment,
            lease_epoch=epoch,
            events=[spec],
        )
        links[run_id] = link
    return BatchChain(sequences=sequences, links=links, heads=heads)


def tail_values(chained: BatchChain, run_id: int) -> dict[str, Any]:
    """The run's ledger head and next sequence after its one event of the batch, for the
    verdict's per-run values."""
    return {
        ledger.HEAD_FIELD: chained.heads[run_id],
        ledger.SEQUENCE_FIELD: chained.sequences[run_id] + 1,
    }


def insert_batch_events(
    events: Mapping[int, EventSpec], chained: BatchChain, *, segment: str, epoch: int
) -> None:
    """Append one event to each run keyed in ``events``, at the sequence and with the link
    ``chained`` gives it (``chain_batch_events``, signed the same ``segment``/``epoch``), in one
    INSERT.

    The one place where a batch's event rows are built. Call only while holding the runs' rows,
    in the transaction whose ``UPDATE`` wrote their heads.
    """
    db = connections[DEFAULT_DB_ALIAS]
    append_events(
        event_row(
            db,
            chained.sequences[run_id],
            spec,
            (segment, epoch),
            chained.links[run_id],
            run_id=run_id,
        )
        for run_id, spec in events.items()
    )
