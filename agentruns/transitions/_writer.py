"""The two writers behind ``agentruns.transitions`` and the SQL they execute. Private: only the
transitions call them.

* ``segment_write`` — a segment's own writes under its lease (the step boundary), in
  precompiled SQL.
* ``guarded_write`` — any other guard, through the ORM.

Both add ``updated_at``, take database-computed values as ``DbValue`` (the clock, the lease
deadline, an increment) and append events in the same transaction as the guarded ``UPDATE``,
chained by ``agentruns.ledger`` (each event's ``prev_hash`` and ``hash``; the run's head written
in the segment's own ``UPDATE``, or in the transaction of any other guarded write).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, ParamSpec, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from agentruns import conf, ledger
from agentruns.exceptions import LeaseholdError, StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, Status

try:  # the server-binding cursor of psycopg 3 (``_cursor``)
    from psycopg import Cursor as _ServerCursor
except ImportError:  # pragma: no cover - psycopg 2 or no PostgreSQL driver
    _ServerCursor = None  # type: ignore[assignment,misc]

P = ParamSpec("P")
R = TypeVar("R")


def state_write(func: Callable[P, R]) -> Callable[P, R]:
    """Turn a database error into ``StateWriteFailed`` (the transaction has rolled back)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except LeaseholdError:
            raise
        except DatabaseError as exc:
            raise StateWriteFailed(
                f"{func.__name__}: the database refused the write ({type(exc).__name__})",
                transition=func.__name__,
            ) from exc

    return wrapper


def lease_deadline() -> ExpressionWrapper[CombinedExpression]:
    """``Now() + LEASE_SECONDS`` on the database clock."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=conf.get("LEASE_SECONDS"))),
        output_field=DateTimeField(),
    )


# --- The step boundary: precompiled SQL -------------------------------------------------------
#
# A step boundary is the runtime's most frequent write (two to five per round), so its
# owner-guarded UPDATE and the event INSERT (used by every transition) bypass the ORM's query
# building, which cost about ten times the statements themselves. What they write is what the ORM
# would: values are adapted by the model fields (JSON as ``JSONField`` adapts it for the backend,
# timestamps as ``DateTimeField``), and the database clock is read with the very SQL Django
# compiles for ``Now()`` and ``Now() + duration``, so on SQLite (timestamps stored as text,
# compared as text) a deadline written here compares with ``Now()`` exactly like one written by
# the ORM.


class DbValue(Enum):
    """A value the database computes in a guarded ``UPDATE``."""

    NOW = "now"  # the database clock
    LEASE_DEADLINE = "lease_deadline"  # the database clock + LEASE_SECONDS
    INCREMENT = "increment"  # the column + 1
    LATER = "later"  # the database clock + a duration given with it (``Later``)


@dataclass(frozen=True)
class Later:
    """A value the database computes: its clock + ``duration`` (e.g. an approval deadline),
    written by the same ``UPDATE`` as the rest of a segment's write."""

    duration: timedelta


# The supported vendors (settings: SQLite or PostgreSQL). ``%%`` is a literal ``%``.
NOW_SQL = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}
# Now() + a DurationField parameter, as Django compiles it (SQLite: a Python function that the
# backend registers on every connection and that formats the sum as Django stores datetimes).
DEADLINE_SQL = {
    "postgresql": "(STATEMENT_TIMESTAMP() + %s)",
    "sqlite": "(django_format_dtdelta('+', STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW'), %s))",
}
RUN_FIELDS = {f.name: f for f in AgentRun._meta.concrete_fields}
_EVENT_FIELDS = {f.name: f for f in AgentRunEvent._meta.concrete_fields}
_EVENT_COLUMNS = (
    "run",
    "sequence",
    "kind",
    "segment",
    "lease_epoch",
    "duration_ms",
    "payload",
    "actor",
    "created_at",
    "actor_ref",
    "prev_hash",
    "hash",
)
_SEGMENT_GUARD = ("id", "status", "claimed_by", "lease_epoch")
# A boundary that appends events also expects the run's next sequence to be the one its events
# are numbered (and chained) from: an append it did not make cannot be forked.
_EVENTS_GUARD = (*_SEGMENT_GUARD, ledger.SEQUENCE_FIELD)
_DURATION: DurationField[timedelta, timedelta] = DurationField()
_EVENT_BATCH = 100  # rows per INSERT, far below any backend's parameter limit
_sql_cache: dict[tuple[Any, ...], str] = {}


def _execute(db: BaseDatabaseWrapper, sql: str, params: list[Any]) -> int:
    """Run one statement; its row count. Like ``QuerySet.update``, an error marks an enclosing
    ``atomic`` block for rollback."""
    with transaction.mark_for_rollback_on_error(db.alias), _cursor(db) as cursor:
        cursor.execute(sql, params)
        return cast(int, cursor.rowcount)


def _cursor(db: BaseDatabaseWrapper) -> Any:
    """A cursor for the precompiled statements. PostgreSQL with psycopg 3: one that binds the
    parameters on the server (sent beside the statement, never quoted into its text by the
    client, which cost as much Python as the rest of a boundary) and, with
    ``PREPARED_STATEMENTS`` (the default), prepares each statement on the server the first time
    the connection runs it (``_PreparingCursor``); wrapped by Django like any cursor (query log,
    execute wrappers)."""
    if db.vendor != "postgresql" or _ServerCursor is None:
        return db.cursor()
    db.ensure_connection()
    connection = db.connection
    if not conf.get("PREPARED_STATEMENTS"):
        return db._prepare_cursor(_ServerCursor(connection))  # type: ignore[attr-defined]
    if connection.prepare_threshold is None:
        # Django switches psycopg's preparing off (``prepare_threshold=None``), which refuses
        # even an explicit ``prepare=True``. A threshold no query reaches switches it back on
        # for the statements that ask (these); Django's own cursors bind on the client and are
        # never prepared whatever the threshold.
        connection.prepare_threshold = _ONLY_WHEN_ASKED
    return db._prepare_cursor(_PreparingCursor(connection))  # type: ignore[attr-defined]


_ONLY_WHEN_ASKED = 2**62

if _ServerCursor is not None:

    class _PreparingCursor(_ServerCursor):
        """psycopg's server-binding cursor that prepares every statement it executes (psycopg
        keeps the prepared statements per connection and replaces them when a schema change or
        a full cache asks for it)."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            return super().execute(query, params, **kwargs)

        def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> None:
            # psycopg keeps the statement it sent (``_query``) only when it sends its text; a
            # prepared one is sent by name. Django's query log reads the statement from there.
            self._query = pgq
            super()._send_query_prepared(name, pgq, **kwargs)


def _insert_sql(db: BaseDatabaseWrapper, rows: int) -> str:
    key = ("insert", db.vendor, rows)
    if key not in _sql_cache:
        quote = db.ops.quote_name
        columns = ", ".join(quote(_EVENT_FIELDS[name].column) for name in _EVENT_COLUMNS)
        row = "(" + ", ".join(["%s"] * len(_EVENT_COLUMNS)) + ")"
        _sql_cache[key] = (
            f"INSERT INTO {quote(AgentRunEvent._meta.db_table)} ({columns}) "
            f"VALUES {', '.join([row] * rows)}"
        )
    return _sql_cache[key]


def event_row(
    db: BaseDatabaseWrapper,
    run_id: int,
    sequence: int,
    spec: EventSpec,
    signer: tuple[str, int],
    chained: ledger.Link,
    created: Any,
) -> list[Any]:
    """The parameters of one event row, in ``_EVENT_COLUMNS`` order (``_insert_sql``)."""
    return [
        run_id,
        sequence,
        str(spec.kind),
        signer[0],
        signer[1],
        spec.duration_ms,
        _EVENT_FIELDS["payload"].get_db_prep_save(spec.payload, db),
        spec.actor_id,
        created,
        spec.actor_id,
        chained.prev_hash,
        chained.hash,
    ]


def insert_events(
    run_id: int,
    first_sequence: int,
    segment: str,
    epoch: int,
    events: Iterable[EventSpec],
    links: list[ledger.Link],
) -> int:
    """Append ``events`` numbered from ``first_sequence`` with their ``links`` in the chain
    (``ledger.chain``; one multi-row INSERT); the next sequence. ``created_at`` is the app
    server's clock, as ``auto_now_add`` would set it. The caller writes the new head."""
    events = list(events)
    if not events:
        return first_sequence
    if len(links) != len(events):
        raise ValueError("every event needs its link in the chain")
    db = connections[DEFAULT_DB_ALIAS]
    created = _EVENT_FIELDS["created_at"].get_db_prep_value(timezone.now(), db)
    for start in range(0, len(events), _EVENT_BATCH):
        batch = events[start : start + _EVENT_BATCH]
        params: list[Any] = []
        for offset, spec in enumerate(batch):
            params += event_row(
                db,
                run_id,
                first_sequence + start + offset,
                spec,
                (segment, epoch),
                links[start + offset],
                created,
            )
        _execute(db, _insert_sql(db, len(batch)), params)
    return first_sequence + len(events)


def _update_sql(
    db: BaseDatabaseWrapper,
    shape: tuple[tuple[str, DbValue | None], ...],
    guard: tuple[str, ...] = _SEGMENT_GUARD,
) -> str:
    """``UPDATE`` of the columns in ``shape`` (a ``DbValue`` or ``None`` for a parameter) under
    ``guard`` (each field equal to a parameter; the owner guard by default)."""
    key = ("update", db.vendor, shape, guard)
    if key not in _sql_cache:
        if db.vendor not in NOW_SQL:
            raise NotImplementedError(f"no boundary SQL for {db.vendor} (SQLite or PostgreSQL)")
        quote = db.ops.quote_name
        assignments = []
        for name, computed in shape:
            column = quote(RUN_FIELDS[name].column)
            if computed is DbValue.NOW:
                assignments.append(f"{column} = {NOW_SQL[db.vendor]}")
            elif computed in (DbValue.LEASE_DEADLINE, DbValue.LATER):
                assignments.append(f"{column} = {DEADLINE_SQL[db.vendor]}")
            elif computed is DbValue.INCREMENT:
                assignments.append(f"{column} = {column} + 1")
            else:
                assignments.append(f"{column} = %s")
        where = " AND ".join(f"{quote(RUN_FIELDS[name].column)} = %s" for name in guard)
        _sql_cache[key] = (
            f"UPDATE {quote(AgentRun._meta.db_table)} SET {', '.join(assignments)} WHERE {where}"
        )
    return _sql_cache[key]


def _boundary_sql(
    db: BaseDatabaseWrapper, shape: tuple[tuple[str, DbValue | None], ...], rows: int
) -> str:
    """PostgreSQL: the guarded ``UPDATE`` (under the owner guard and the expected next
    sequence) and the INSERT of ``rows`` events as one statement: a data-modifying CTE whose
    INSERT selects from the UPDATE's ``RETURNING``, so a guard that matches nothing inserts
    nothing, and the INSERT's row count is the verdict."""
    key = ("boundary", db.vendor, shape, rows)
    if key not in _sql_cache:
        _sql_cache[key] = _with_events_sql(db, _update_sql(db, shape, _EVENTS_GUARD), rows)
    return _sql_cache[key]


def _with_events_sql(db: BaseDatabaseWrapper, update: str, rows: int) -> str:
    """PostgreSQL: ``update`` (one guarded ``UPDATE``, any SQL) and the INSERT of ``rows``
    events (parameters in ``_EVENT_COLUMNS`` order after the UPDATE's) as one statement."""
    return f"WITH u AS ({update} RETURNING 1) {_events_insert_sql(db, rows)}"


def _events_insert_sql(db: BaseDatabaseWrapper, rows: int) -> str:
    """The INSERT of ``rows`` events, one for each row of the CTE ``u`` (none when ``u`` is
    empty: the guard matched nothing)."""
    quote = db.ops.quote_name
    columns = ", ".join(quote(_EVENT_FIELDS[name].column) for name in _EVENT_COLUMNS)
    # The VALUES list is typed (its literals are untyped text otherwise).
    row = (
        "(" + ", ".join(f"CAST(%s AS {_EVENT_FIELDS[n].db_type(db)})" for n in _EVENT_COLUMNS) + ")"
    )
    return (
        f"INSERT INTO {quote(AgentRunEvent._meta.db_table)} ({columns}) "
        f"SELECT v.* FROM u, (VALUES {', '.join([row] * rows)}) AS v"
    )


def _event_rows(
    db: BaseDatabaseWrapper,
    run_id: int,
    first: int,
    signer: tuple[str, int],
    events: list[EventSpec],
    links: list[ledger.Link],
) -> list[Any]:
    """The parameters of ``events``' rows numbered from ``first`` (``_with_events_sql``)."""
    created = _EVENT_FIELDS["created_at"].get_db_prep_value(timezone.now(), db)
    rows: list[Any] = []
    for offset, spec in enumerate(events):
        rows += event_row(db, run_id, first + offset, spec, signer, links[offset], created)
    return rows


def _orm_update_sql(run_id: int, guard: Q, values: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """The SQL and parameters of ``AgentRun.objects.filter(pk=run_id, guard).update(values)``,
    compiled by Django (values may be expressions: ``F``, ``Now()``, …) but not run."""
    query = cast(
        UpdateQuery, AgentRun.objects.filter(Q(pk=run_id) & guard).query.chain(UpdateQuery)
    )
    query.add_update_values(dict(values))
    sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    return sql, list(params)


def _update_parts(
    db: BaseDatabaseWrapper, values: Mapping[str, Any]
) -> tuple[tuple[tuple[str, DbValue | None], ...], list[Any]]:
    """The shape (``_update_sql``) and the SET parameters of an ``UPDATE`` of ``values`` and
    ``updated_at``."""
    shape: list[tuple[str, DbValue | None]] = []
    params: list[Any] = []
    for name, value in {**values, "updated_at": DbValue.NOW}.items():
        if isinstance(value, Later):
            shape.append((name, DbValue.LATER))
            params.append(_DURATION.get_db_prep_value(value.duration, db))
        elif isinstance(value, DbValue):
            shape.append((name, value))
            if value is DbValue.LEASE_DEADLINE:
                deadline = timedelta(seconds=conf.get("LEASE_SECONDS"))
                params.append(_DURATION.get_db_prep_value(deadline, db))
        else:
            shape.append((name, None))
            params.append(RUN_FIELDS[name].get_db_prep_save(value, db))
    return tuple(shape), params


def _owner(lease: Lease) -> list[Any]:
    return [lease.run_id, str(Status.RUNNING), lease.owner, lease.epoch]


def _segment_update(
    lease: Lease, values: Mapping[str, Any], written: list[AgentRun] | None = None
) -> bool:
    """The owner-guarded ``UPDATE`` of ``values`` (and ``updated_at``); whether it took the row.
    With ``written``, the row as the ``UPDATE`` left it is appended to it (``RETURNING``, the
    same statement: no read back).

    Guard: ``id``, ``running``, ``claimed_by`` = owner, ``lease_epoch`` = epoch.
    """
    db = connections[DEFAULT_DB_ALIAS]
    shape, params = _update_parts(db, values)
    sql, params = _update_sql(db, shape), params + _owner(lease)
    if written is None:
        return _execute(db, sql, params) == 1
    return _returned(f"{sql} RETURNING {_run_columns(db)}", params, written)


def segment_write(
    lease: Lease,
    values: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    loop_state: Mapping[str, Any] | None = None,
    written: list[AgentRun] | None = None,
    await_commit: bool = False,
) -> bool:
    """A segment's own write (the step boundary): one owner-guarded ``UPDATE`` of ``values``
    (and ``updated_at``, and ``loop_state`` when given) in precompiled SQL, and ``events`` signed
    by the lease, numbered from its counter and chained from its head. ``False``: the guard
    matched nothing; nothing was written. ``written``: the row as the write left it is appended
    to it (returned by the ``UPDATE`` itself, ``RETURNING``: no read back).

    With events the guard also expects the run's ``next_sequence`` to be the lease's counter,
    and the same ``UPDATE`` advances it and writes the new ledger head. On PostgreSQL the
    ``UPDATE`` and the INSERT are one statement (``_boundary_sql``) in autocommit: there is no
    moment between them. On SQLite they are two statements in one (IMMEDIATE) transaction.

    An autocommit statement the database has received completes even if the process that sent
    it dies meanwhile (e.g. while it waits for the row): its guard still decides, and what it
    records is what the segment did. ``await_commit`` keeps it in a transaction the segment
    commits itself (``BEGIN``/``COMMIT`` around it), so a death before that ``COMMIT`` undoes it
    (the boundary that records a non-idempotent write: the run is then in doubt, §9.1).
    """
    if loop_state is not None:
        values = {**values, "loop_state": dict(loop_state)}
    events = list(events)
    if not events:
        return _segment_update(lease, values, written)
    if lease.head is None:
        # A lease that does not know the head (and so its counter) reads both from the row:
        # nobody else appends while the guard can match (and if someone did, the sequence in
        # the guard refuses the write).
        _, lease.head, lease.next_sequence = ledger.read_tail(lease.run_id)
    first = lease.next_sequence
    links, head = ledger.chain(
        run_uuid=lease.uuid,
        prev_hash=lease.head,
        first_sequence=first,
        segment=lease.owner,
        lease_epoch=lease.epoch,
        events=events,
    )
    end = first + len(events)
    db = connections[DEFAULT_DB_ALIAS]
    shape, params = _update_parts(
        db, {**values, ledger.HEAD_FIELD: head, ledger.SEQUENCE_FIELD: end}
    )
    guard = [*_owner(lease), first]
    if db.vendor == "postgresql" and len(events) <= _EVENT_BATCH:
        rows = _event_rows(db, lease.run_id, first, (lease.owner, lease.epoch), events, links)
        sql = _boundary_sql(db, shape, len(events))
        if written is not None:  # the row as the UPDATE left it, from the same statement
            update = _update_sql(db, shape, _EVENTS_GUARD)
            columns = _run_columns(db)
            sql = (
                f"WITH u AS ({update} RETURNING {columns}), "
                f"e AS ({_events_insert_sql(db, len(events))}) SELECT {columns} FROM u"
            )
        with transaction.atomic() if db.in_atomic_block or await_commit else nullcontext():
            # Inside a caller's transaction a failure undoes only this (a savepoint); in
            # autocommit the statement is its own transaction (no BEGIN/COMMIT).
            if written is None:
                taken = _execute(db, sql, params + guard + rows) == len(events)
            else:
                taken = _returned(sql, params + guard + rows, written)
        if not taken:
            return False
    else:
        with transaction.atomic():
            update = _update_sql(db, shape, _EVENTS_GUARD)
            if written is None:
                taken = _execute(db, update, params + guard) == 1
            else:
                taken = _returned(f"{update} RETURNING {_run_columns(db)}", params + guard, written)
            if not taken:
                return False
            insert_events(lease.run_id, first, lease.owner, lease.epoch, events, links)
    lease.next_sequence, lease.head = end, head
    return True


def _run_columns(db: BaseDatabaseWrapper) -> str:
    return ", ".join(db.ops.quote_name(field.column) for field in RUN_FIELDS.values())


def _returned(sql: str, params: list[Any], written: list[AgentRun]) -> bool:
    """Run a guarded ``UPDATE`` that returns the run's row (``RETURNING``); whether it took
    the row, which is appended to ``written``."""
    db = connections[DEFAULT_DB_ALIAS]
    with transaction.mark_for_rollback_on_error(db.alias):
        rows = list(AgentRun.objects.raw(sql, params))
    written += rows
    return len(rows) == 1


def _orm_value(name: str, value: Any) -> Any:
    if isinstance(value, Later):
        return ExpressionWrapper(Now() + Value(value.duration), output_field=DateTimeField())
    if value is DbValue.NOW:
        return Now()
    if value is DbValue.LEASE_DEADLINE:
        return lease_deadline()
    if value is DbValue.INCREMENT:
        return F(name) + 1
    return value


def guarded_write(
    run_id: int,
    guard: Q,
    values: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    segment: str = "",
    epoch: int = 0,
    lease: Lease | None = None,
    savepoint: bool = True,
    locked: AgentRun | None = None,
) -> bool:
    """Every other state change: one ``UPDATE`` of ``values`` (and ``updated_at``) on the run
    ``run_id`` filtered by ``guard``, then ``events`` numbered from the run's ``next_sequence``
    (the ``UPDATE`` holds the row until commit) and chained from the run's head, both read in
    one ``SELECT`` and written with the events, in one transaction. Events are signed
    ``segment``/``epoch``, or by ``lease`` (a claim just made), whose counter and head then
    continue after them. ``False``: the guard matched nothing;
    nothing was written.

    ``locked``: the run as the caller read it under its row lock (a decision): the events are
    numbered and chained from its counter and head before the ``UPDATE``, which writes both
    itself (no read).

    Inside a caller's transaction (the reaper's batch) the write is a savepoint, so a failure
    undoes only it; ``savepoint=False`` when the caller's transaction is the transition's own."""
    events = list(events)
    signer = (lease.owner, lease.epoch) if lease is not None else (segment, epoch)
    values = {name: _orm_value(name, value) for name, value in values.items()}
    db = connections[DEFAULT_DB_ALIAS]
    with transaction.atomic(savepoint=savepoint):
        if events and locked is not None:
            first = getattr(locked, ledger.SEQUENCE_FIELD)
            prev = getattr(locked, ledger.HEAD_FIELD) or ledger.genesis(locked.uuid)
            links, head = _chain(locked.uuid, prev, first, signer, events)
            values[ledger.HEAD_FIELD] = head
            values[ledger.SEQUENCE_FIELD] = first + len(events)
            if db.vendor == "postgresql" and len(events) <= _EVENT_BATCH:
                # The UPDATE (as the ORM compiles it) and the events in one statement.
                update, params = _orm_update_sql(run_id, guard, {**values, "updated_at": Now()})
                rows = _event_rows(db, run_id, first, signer, events, links)
                sql = _with_events_sql(db, update, len(events))
                if _execute(db, sql, params + rows) != len(events):
                    return False
                _written(locked, lease, head, first + len(events))
                return True
        if events and locked is None:
            # The UPDATE returns the run's uuid, head and counter, which it does not change:
            # under the row it holds, the last event's hash and the next free sequence.
            tail = _update_returning_tail(run_id, guard, {**values, "updated_at": Now()})
            if tail is None:
                return False
            run_uuid, prev, first = tail
            links, head = _chain(run_uuid, prev, first, signer, events)
        elif AgentRun.objects.filter(Q(pk=run_id) & guard).update(**values, updated_at=Now()) != 1:
            return False
        if events:
            end = insert_events(run_id, first, *signer, events, links)
            if locked is None:
                ledger.write_tail(run_id, head, end)
            _written(locked, lease, head, end)
    return True


def _update_returning_tail(
    run_id: int, guard: Q, values: Mapping[str, Any]
) -> tuple[Any, str, int] | None:
    """The guarded ``UPDATE`` (as the ORM compiles it) returning the run's uuid, ledger head
    (the genesis value when never written) and next sequence, in one statement; ``None``: the
    guard matched nothing."""
    db = connections[DEFAULT_DB_ALIAS]
    update, params = _orm_update_sql(run_id, guard, values)
    names = ("uuid", ledger.HEAD_FIELD, ledger.SEQUENCE_FIELD)
    returning = ", ".join(db.ops.quote_name(RUN_FIELDS[name].column) for name in names)
    with transaction.mark_for_rollback_on_error(db.alias), db.cursor() as cursor:
        cursor.execute(f"{update} RETURNING {returning}", params)
        rows = cursor.fetchall()
    if len(rows) != 1:
        return None
    stored_uuid, head, sequence = rows[0]
    run_uuid = RUN_FIELDS["uuid"].to_python(stored_uuid)  # SQLite stores it as hex
    return run_uuid, head or ledger.genesis(run_uuid), sequence


def _written(locked: AgentRun | None, lease: Lease | None, head: str, end: int) -> None:
    """After appending events: the locked run shows the new head and counter, and the lease
    (a claim just made) continues after them."""
    if locked is not None:
        setattr(locked, ledger.HEAD_FIELD, head)
        setattr(locked, ledger.SEQUENCE_FIELD, end)
    if lease is not None:
        lease.next_sequence, lease.head = end, head


def _chain(
    run_uuid: Any, prev: str, first: int, signer: tuple[str, int], events: list[EventSpec]
) -> tuple[list[ledger.Link], str]:
    return ledger.chain(
        run_uuid=run_uuid,
        prev_hash=prev,
        first_sequence=first,
        segment=signer[0],
        lease_epoch=signer[1],
        events=events,
    )


def stale() -> Q:
    """The reaper's guard: ``running`` with ``lease_expires < Now()`` (the database clock)."""
    return Q(status=Status.RUNNING, lease_expires__lt=Now())
