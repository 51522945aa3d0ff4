"""The set-based writer behind the reaper's batch transitions (docs/design.md §8.1). Private:
only ``agentruns.transitions.reaper`` calls it.

* ``batch_update`` — one guarded ``UPDATE … RETURNING id`` for many runs, with per-run values
  joined from a ``VALUES`` list; the ids it returns are the runs it took (its verdict).
* ``chain_batch_events`` / ``insert_batch_events`` — one event for each of many runs, numbered
  after each run's last event and chained from its ledger head, in multi-row INSERTs; the new
  heads go into the verdict's ``UPDATE``.

The same SQL runs on PostgreSQL and on SQLite (3.35 or later: ``UPDATE … FROM`` and
``RETURNING``); only PostgreSQL needs the ``VALUES`` typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Max

from agentruns import ledger
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent
from agentruns.transitions._sql import (
    EVENT_BATCH,
    NOW_SQL,
    RUN_FIELDS,
    event_row,
    insert_sql,
    run_statement,
)


def _db() -> BaseDatabaseWrapper:
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor not in NOW_SQL:
        raise NotImplementedError(f"no batch SQL for {db.vendor} (SQLite or PostgreSQL)")
    return db


def _returned_ids(db: BaseDatabaseWrapper, sql: str, params: list[Any]) -> set[int]:
    """Run one ``… RETURNING id``; the ids. An error marks an enclosing ``atomic`` for rollback."""
    with transaction.mark_for_rollback_on_error(db.alias), db.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def batch_update(
    *,
    guard: str,
    guard_params: Sequence[Any],
    fixed: Mapping[str, Any],
    per_run: Mapping[int, Mapping[str, Any]],
) -> set[int]:
    """One ``UPDATE`` of the runs keyed in ``per_run`` that still match ``guard``; their ids.

    ``guard`` is SQL over the run table's columns (``%s`` for ``guard_params``) and is checked
    in the ``UPDATE`` itself, row by row; ``fixed`` holds the values every run gets (SQL text
    for a database-computed one is passed as ``Sql``), ``per_run`` each run's own (the same
    field names for every run; may be empty mappings). ``updated_at`` is set to the database
    clock. An id missing from the result: the guard did not match it, nothing was written.
    """
    if not per_run:
        return set()
    db = _db()
    quote = db.ops.quote_name
    table = quote(AgentRun._meta.db_table)
    now = NOW_SQL[db.vendor]
    assignments: list[str] = []
    params: list[Any] = []
    for name, value in fixed.items():
        if isinstance(value, Sql):
            assignments.append(f"{quote(RUN_FIELDS[name].column)} = {value.text}")
        else:
            assignments.append(f"{quote(RUN_FIELDS[name].column)} = %s")
            params.append(RUN_FIELDS[name].get_db_prep_save(value, db))
    assignments.append(f"{quote(RUN_FIELDS['updated_at'].column)} = {now}")
    names = sorted(next(iter(per_run.values())))
    id_column = f"{table}.{quote('id')}"
    if not names:  # nothing per run: a plain id list
        sql = (
            f"UPDATE {table} SET {', '.join(assignments)} "
            f"WHERE {id_column} IN ({', '.join(['%s'] * len(per_run))}) AND ({guard}) "
            f"RETURNING {id_column}"
        )
        return _returned_ids(db, sql, [*params, *per_run, *guard_params])
    # PostgreSQL types a VALUES column from its first row: say each column's type.
    typed = db.vendor == "postgresql"
    marks = ["%s"] + [f"CAST(%s AS {RUN_FIELDS[n].db_type(db)})" if typed else "%s" for n in names]
    row = "(" + ", ".join(marks) + ")"
    aliases = ["v_id"] + [f"v_{n}" for n in names]
    assignments += [f"{quote(RUN_FIELDS[n].column)} = v.v_{n}" for n in names]
    values: list[Any] = []
    for run_id, own in per_run.items():
        if sorted(own) != names:
            raise ValueError("every run of a batch update needs the same per-run fields")
        values.append(run_id)
        values += [RUN_FIELDS[n].get_db_prep_save(own[n], db) for n in names]
    sql = (
        f"WITH v ({', '.join(aliases)}) AS (VALUES {', '.join([row] * len(per_run))}) "
        f"UPDATE {table} SET {', '.join(assignments)} FROM v "
        f"WHERE {id_column} = v.v_id AND ({guard}) RETURNING {id_column}"
    )
    return _returned_ids(db, sql, [*values, *params, *guard_params])


class Sql:
    """A database-computed value for ``batch_update``'s ``fixed`` (trusted SQL text)."""

    def __init__(self, text: str) -> None:
        self.text = text


def now_sql() -> Sql:
    """The database clock, as ``DbValue.NOW`` writes it."""
    return Sql(NOW_SQL[_db().vendor])


def increment_sql(name: str) -> Sql:
    """The run field ``name`` + 1, as ``DbValue.INCREMENT`` writes it."""
    column = _db().ops.quote_name(RUN_FIELDS[name].column)
    return Sql(f"{column} + 1")


def stale_guard_sql() -> str:
    """The reaper's guard (``transitions._writer.stale``) as SQL: ``running`` and
    ``lease_expires`` before the database clock. Takes one parameter: the status."""
    db = _db()
    quote = db.ops.quote_name
    return (
        f"{quote(RUN_FIELDS['status'].column)} = %s AND "
        f"{quote(RUN_FIELDS['lease_expires'].column)} < {NOW_SQL[db.vendor]}"
    )


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
    ``chained`` gives it (``chain_batch_events``, signed the same ``segment``/``epoch``), in
    multi-row INSERTs (one per 100 events).

    The one place where a batch's event rows are built. Call only while holding the runs' rows,
    in the transaction whose ``UPDATE`` wrote their heads.
    """
    if not events:
        return
    db = _db()
    items = list(events.items())
    for start in range(0, len(items), EVENT_BATCH):
        chunk = items[start : start + EVENT_BATCH]
        params: list[Any] = []
        for run_id, spec in chunk:
            params += event_row(
                db,
                run_id,
                chained.sequences[run_id],
                spec,
                (segment, epoch),
                chained.links[run_id],
            )
        run_statement(db, insert_sql(db, len(chunk)), params)
