"""The claim of a queued run as one statement, and the row it hands the segment. Private: only
``agentruns.transitions.segment_writes`` calls it.

A worker's task carries only the run's uuid; before, its claim read the run, took it (an
``UPDATE`` returning the chain's tail, the ``lease`` event, the tail written back: one
transaction) and the segment then read the run with its configuration and its events again. Here
the claim is one guarded ``UPDATE`` whose ``WHERE`` pins everything its event is chained from —
``status`` queued, ``lease_epoch``, ``next_sequence`` and ``ledger_head`` — so the event's hash
is computed before the statement and the same statement writes the new head. On PostgreSQL the
``UPDATE``, the event's INSERT and the read of the row as claimed with its configuration are one
statement (data-modifying CTEs); on SQLite two statements in one IMMEDIATE transaction, after the
read.

A run that was never claimed (``lease_epoch`` 0, no events, the genesis head: a freshly queued
run, the common case) needs no read first: the guard is tried with those values at once, and
only when it matches nothing is the row read and the guard tried with what it holds.
"""

from __future__ import annotations

from contextlib import nullcontext
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.db.models.sql import Query

from agentruns import ledger
from agentruns.conf import app_settings
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent, Status
from agentruns.transitions._sql import (
    DEADLINE_SQL,
    DURATION,
    EVENT_COLUMNS,
    EVENT_FIELDS,
    NOW_SQL,
    RUN_FIELDS,
    event_row,
    insert_events,
)

M = TypeVar("M", bound=Model)

#: What the claim's guard pins beside the run's name (``id`` or ``uuid``) and its status.
_PINNED = ("lease_epoch", ledger.SEQUENCE_FIELD, ledger.HEAD_FIELD)
_CONFIG_FIELDS = list(AgentConfiguration._meta.concrete_fields)
_sql_cache: dict[tuple[Any, ...], str] = {}


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


def _quoted(db: BaseDatabaseWrapper, name: str) -> str:
    return db.ops.quote_name(RUN_FIELDS[name].column)


def _claim_update_sql(db: BaseDatabaseWrapper, by: str) -> str:
    """The guarded ``UPDATE`` of a claim (parameters: identity, lease duration, new epoch, new
    head, new next sequence; then the guard: the run's ``by`` value, status, epoch, sequence,
    head), without ``RETURNING``."""
    q = db.ops.quote_name
    now = NOW_SQL[db.vendor]
    started = _quoted(db, "started_at")
    assignments = [
        f"{_quoted(db, 'status')} = '{Status.RUNNING}'",
        f"{_quoted(db, 'claimed_by')} = %s",
        f"{_quoted(db, 'lease_expires')} = {DEADLINE_SQL[db.vendor]}",
        f"{_quoted(db, 'lease_epoch')} = %s",
        f"{started} = COALESCE({started}, {now})",
        f"{_quoted(db, 'updated_at')} = {now}",
        f"{_quoted(db, ledger.HEAD_FIELD)} = %s",
        f"{_quoted(db, ledger.SEQUENCE_FIELD)} = %s",
    ]
    guard = " AND ".join(f"{_quoted(db, name)} = %s" for name in (by, "status", *_PINNED))
    return f"UPDATE {q(AgentRun._meta.db_table)} SET {', '.join(assignments)} WHERE {guard}"


def _run_columns(db: BaseDatabaseWrapper, prefix: str = "") -> str:
    return ", ".join(prefix + db.ops.quote_name(f.column) for f in RUN_FIELDS.values())


def _claim_sql(db: BaseDatabaseWrapper, by: str, events: int) -> str:
    """PostgreSQL: the claim's ``UPDATE``, the INSERT of ``events`` events (their parameters,
    in ``EVENT_COLUMNS`` order without the run, after the ``UPDATE``'s; the run's id comes from
    the ``UPDATE``) and the row as claimed with its configuration's columns, as one statement.
    No row: the guard matched nothing, and nothing was written."""
    key = ("claim", db.vendor, by, events)
    if key not in _sql_cache:
        q = db.ops.quote_name
        columns = ", ".join(q(EVENT_FIELDS[name].column) for name in EVENT_COLUMNS)
        typed = ", ".join(f"CAST(%s AS {EVENT_FIELDS[n].db_type(db)})" for n in EVENT_COLUMNS[1:])
        values = ", ".join([f"({typed})"] * events)
        config = ", ".join(f"c.{q(f.column)}" for f in _CONFIG_FIELDS)
        joined = f"c.{q(AgentConfiguration._meta.pk.column)} = u.{_quoted(db, 'configuration')}"
        _sql_cache[key] = (
            f"WITH u AS ({_claim_update_sql(db, by)} RETURNING {_run_columns(db)}), "
            f"e AS (INSERT INTO {q(AgentRunEvent._meta.db_table)} ({columns}) "
            f"SELECT u.{q(AgentRun._meta.pk.column)}, v.* FROM u, (VALUES {values}) AS v) "
            f"SELECT {_run_columns(db, 'u.')}, {config} FROM u "
            f"LEFT JOIN {q(AgentConfiguration._meta.db_table)} c "
            f"ON {joined}"
        )
    return _sql_cache[key]


def _instance(db: BaseDatabaseWrapper, model: type[M], fields: list[Any], values: list[Any]) -> M:
    """A model instance from a row's raw column values, converted as the ORM converts them."""
    compiler = db.ops.compiler("SQLCompiler")(Query(model), db, db.alias)
    converters = compiler.get_converters([f.get_col(model._meta.db_table) for f in fields])
    if converters:
        values = list(next(iter(compiler.apply_converters([values], converters))))
    return model.from_db(db.alias, [f.attname for f in fields], values)


def claim(
    *, by: str, value: Any, run_uuid: UUID, tail: Tail, identity: str, events: list[EventSpec]
) -> tuple[Lease, AgentRun] | None:
    """Claim the run whose ``by`` (``id`` or ``uuid``) is ``value`` if it is queued and its tail
    is ``tail``: ``running``, claimed by ``identity`` until the database clock plus
    ``LEASE_SECONDS``, epoch + 1, ``events`` appended and chained. The lease and the row as the
    claim left it, with its configuration; ``None``: the guard matched nothing (nothing written).
    """
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor not in NOW_SQL:
        raise NotImplementedError(f"no claim SQL for {db.vendor} (SQLite or PostgreSQL)")
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
    deadline = DURATION.get_db_prep_value(timedelta(seconds=app_settings().lease_seconds), db)
    params: list[Any] = [identity, deadline, epoch, head, end]
    params += [RUN_FIELDS[by].get_db_prep_value(value, db), str(Status.QUEUED)]
    params += [tail.epoch, tail.sequence, tail.stored_head]
    run_fields = list(RUN_FIELDS.values())
    if db.vendor == "postgresql":
        for offset, spec in enumerate(events):
            row = event_row(db, 0, tail.sequence + offset, spec, (identity, epoch), links[offset])
            params += row[1:]  # the run's id comes from the UPDATE
        with (
            transaction.atomic() if db.in_atomic_block else nullcontext(),
            transaction.mark_for_rollback_on_error(db.alias),
            db.cursor() as cursor,
        ):
            cursor.execute(_claim_sql(db, by, len(events)), params)
            rows = cursor.fetchall()
        if len(rows) != 1:
            return None
        values = list(rows[0])
        run = _instance(db, AgentRun, run_fields, values[: len(run_fields)])
        if values[len(run_fields)] is not None:  # PROTECT: always, but never guess
            run.configuration = _instance(
                db, AgentConfiguration, _CONFIG_FIELDS, values[len(run_fields) :]
            )
    else:
        sql = f"{_claim_update_sql(db, by)} RETURNING {_run_columns(db)}"
        with transaction.atomic():
            with transaction.mark_for_rollback_on_error(db.alias), db.cursor() as cursor:
                cursor.execute(sql, params)
                rows = cursor.fetchall()
            if len(rows) != 1:
                return None
            run = _instance(db, AgentRun, run_fields, list(rows[0]))
            insert_events(run.pk, tail.sequence, identity, epoch, events, links)
    lease = Lease(run.pk, run_uuid, identity, epoch, next_sequence=end, head=head)
    return lease, run
