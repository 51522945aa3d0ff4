"""The precompiled SQL of the transitions' writers (``_writer``, ``_claim``, ``_batch``). Private:
only ``agentruns.transitions`` uses it.

A step boundary is the runtime's most frequent write (two to five per round), so its
owner-guarded ``UPDATE`` and the event ``INSERT`` (used by every transition) bypass the ORM's
query building, which cost about ten times the statements themselves. What they write is what
the ORM would: values are adapted by the model fields (JSON as ``JSONField`` adapts it for the
backend, timestamps as ``DateTimeField``), and the database clock is read with the very SQL
Django compiles for ``Now()`` and ``Now() + duration``, so on SQLite (timestamps stored as text,
compared as text) a deadline written here compares with ``Now()`` exactly like one written by
the ORM. On PostgreSQL the statements are bound on the server, and prepared once per connection
when ``PREPARED_STATEMENTS`` is on (``cursor_for``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DurationField, Q
from django.db.models.sql import UpdateQuery

from agentruns import ledger
from agentruns.conf import app_settings
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent

try:  # the server-binding cursor of psycopg 3 (``cursor_for``)
    from psycopg import Cursor as _ServerCursor
except ImportError:  # pragma: no cover - psycopg 2 or no PostgreSQL driver
    _ServerCursor = None  # type: ignore[assignment,misc]


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
EVENT_FIELDS = {f.name: f for f in AgentRunEvent._meta.concrete_fields}
EVENT_COLUMNS = (
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
    "ledger_version",
    "ledger_key",
)
SEGMENT_GUARD = ("id", "status", "claimed_by", "lease_epoch")
# A boundary that appends events also expects the run's next sequence to be the one its events
# are numbered (and chained) from: an append it did not make cannot be forked.
EVENTS_GUARD = (*SEGMENT_GUARD, ledger.SEQUENCE_FIELD)
DURATION: DurationField[timedelta, timedelta] = DurationField()
EVENT_BATCH = 100  # rows per INSERT, far below any backend's parameter limit
_sql_cache: dict[tuple[Any, ...], str] = {}


def run_statement(db: BaseDatabaseWrapper, sql: str, params: list[Any]) -> int:
    """Run one statement; its row count. Like ``QuerySet.update``, an error marks an enclosing
    ``atomic`` block for rollback."""
    with transaction.mark_for_rollback_on_error(db.alias), cursor_for(db) as cursor:
        cursor.execute(sql, params)
        return cast(int, cursor.rowcount)


def cursor_for(db: BaseDatabaseWrapper) -> Any:
    """A cursor for the precompiled statements. PostgreSQL with psycopg 3: one that binds the
    parameters on the server (sent beside the statement, never quoted into its text by the
    client, which cost as much Python as the rest of a boundary) in one unnamed statement, which
    holds no state between transactions (safe behind a transaction-mode pooler); with
    ``PREPARED_STATEMENTS`` (off by default), it prepares each statement on the server the first
    time the connection runs it (``_PreparingCursor``), which is only safe where the connection
    keeps one server session (no transaction-mode pooler that does not track prepared
    statements). Wrapped by Django like any cursor (query log, execute wrappers)."""
    if db.vendor != "postgresql" or _ServerCursor is None:
        return db.cursor()
    db.ensure_connection()
    connection = db.connection
    if not app_settings().prepared_statements:
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


def insert_sql(db: BaseDatabaseWrapper, rows: int) -> str:
    key = ("insert", db.vendor, rows)
    if key not in _sql_cache:
        quote = db.ops.quote_name
        columns = ", ".join(quote(EVENT_FIELDS[name].column) for name in EVENT_COLUMNS)
        row = "(" + ", ".join(["%s"] * len(EVENT_COLUMNS)) + ")"
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
) -> list[Any]:
    """The parameters of one event row, in ``EVENT_COLUMNS`` order (``insert_sql``): its
    ``created_at`` and key id as its link in the chain fixed them (the hash covers them)."""
    return [
        run_id,
        sequence,
        str(spec.kind),
        signer[0],
        signer[1],
        spec.duration_ms,
        EVENT_FIELDS["payload"].get_db_prep_save(spec.payload, db),
        spec.actor_id,
        EVENT_FIELDS["created_at"].get_db_prep_value(chained.created_at, db),
        spec.actor_id,
        chained.prev_hash,
        chained.hash,
        ledger.VERSION,
        chained.key_id,
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
    server's clock as the chain stamped it (as ``auto_now_add`` would set it). The caller writes
    the new head."""
    events = list(events)
    if not events:
        return first_sequence
    if len(links) != len(events):
        raise ValueError("every event needs its link in the chain")
    db = connections[DEFAULT_DB_ALIAS]
    for start in range(0, len(events), EVENT_BATCH):
        batch = events[start : start + EVENT_BATCH]
        params: list[Any] = []
        for offset, spec in enumerate(batch):
            params += event_row(
                db,
                run_id,
                first_sequence + start + offset,
                spec,
                (segment, epoch),
                links[start + offset],
            )
        run_statement(db, insert_sql(db, len(batch)), params)
    return first_sequence + len(events)


def update_sql(
    db: BaseDatabaseWrapper,
    shape: tuple[tuple[str, DbValue | None], ...],
    guard: tuple[str, ...] = SEGMENT_GUARD,
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


def boundary_sql(
    db: BaseDatabaseWrapper, shape: tuple[tuple[str, DbValue | None], ...], rows: int
) -> str:
    """PostgreSQL: the guarded ``UPDATE`` (under the owner guard and the expected next
    sequence) and the INSERT of ``rows`` events as one statement: a data-modifying CTE whose
    INSERT selects from the UPDATE's ``RETURNING``, so a guard that matches nothing inserts
    nothing, and the INSERT's row count is the verdict."""
    key = ("boundary", db.vendor, shape, rows)
    if key not in _sql_cache:
        _sql_cache[key] = with_events_sql(db, update_sql(db, shape, EVENTS_GUARD), rows)
    return _sql_cache[key]


def with_events_sql(db: BaseDatabaseWrapper, update: str, rows: int) -> str:
    """PostgreSQL: ``update`` (one guarded ``UPDATE``, any SQL) and the INSERT of ``rows``
    events (parameters in ``EVENT_COLUMNS`` order after the UPDATE's) as one statement."""
    return f"WITH u AS ({update} RETURNING 1) {events_insert_sql(db, rows)}"


def events_insert_sql(db: BaseDatabaseWrapper, rows: int) -> str:
    """The INSERT of ``rows`` events, one for each row of the CTE ``u`` (none when ``u`` is
    empty: the guard matched nothing)."""
    quote = db.ops.quote_name
    columns = ", ".join(quote(EVENT_FIELDS[name].column) for name in EVENT_COLUMNS)
    # The VALUES list is typed (its literals are untyped text otherwise).
    row = "(" + ", ".join(f"CAST(%s AS {EVENT_FIELDS[n].db_type(db)})" for n in EVENT_COLUMNS) + ")"
    return (
        f"INSERT INTO {quote(AgentRunEvent._meta.db_table)} ({columns}) "
        f"SELECT v.* FROM u, (VALUES {', '.join([row] * rows)}) AS v"
    )


def event_rows(
    db: BaseDatabaseWrapper,
    run_id: int,
    first: int,
    signer: tuple[str, int],
    events: list[EventSpec],
    links: list[ledger.Link],
) -> list[Any]:
    """The parameters of ``events``' rows numbered from ``first`` (``with_events_sql``)."""
    rows: list[Any] = []
    for offset, spec in enumerate(events):
        rows += event_row(db, run_id, first + offset, spec, signer, links[offset])
    return rows


def orm_update_sql(run_id: int, guard: Q, values: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """The SQL and parameters of ``AgentRun.objects.filter(pk=run_id, guard).update(values)``,
    compiled by Django (values may be expressions: ``F``, ``Now()``, …) but not run."""
    query = cast(
        UpdateQuery, AgentRun.objects.filter(Q(pk=run_id) & guard).query.chain(UpdateQuery)
    )
    query.add_update_values(dict(values))
    sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    return sql, list(params)


def update_parts(
    db: BaseDatabaseWrapper, values: Mapping[str, Any]
) -> tuple[tuple[tuple[str, DbValue | None], ...], list[Any]]:
    """The shape (``update_sql``) and the SET parameters of an ``UPDATE`` of ``values`` and
    ``updated_at``."""
    shape: list[tuple[str, DbValue | None]] = []
    params: list[Any] = []
    for name, value in {**values, "updated_at": DbValue.NOW}.items():
        if isinstance(value, Later):
            shape.append((name, DbValue.LATER))
            params.append(DURATION.get_db_prep_value(value.duration, db))
        elif isinstance(value, DbValue):
            shape.append((name, value))
            if value is DbValue.LEASE_DEADLINE:
                deadline = timedelta(seconds=app_settings().lease_seconds)
                params.append(DURATION.get_db_prep_value(deadline, db))
        else:
            shape.append((name, None))
            params.append(RUN_FIELDS[name].get_db_prep_save(value, db))
    return tuple(shape), params


def run_columns(db: BaseDatabaseWrapper) -> str:
    return ", ".join(db.ops.quote_name(field.column) for field in RUN_FIELDS.values())
