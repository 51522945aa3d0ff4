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
from datetime import timedelta
from enum import Enum
from typing import Any, ParamSpec, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Max, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now
from django.utils import timezone

from agentruns import conf, ledger
from agentruns.exceptions import LeaseholdError, StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, AgentRunEvent, Status

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


def _next_sequence(run_id: int) -> int:
    """The next free event sequence; call only while holding the run row (lock or guard)."""
    last = AgentRunEvent.objects.filter(run_id=run_id).aggregate(m=Max("sequence"))["m"]
    return 0 if last is None else last + 1


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
_DURATION: DurationField[timedelta, timedelta] = DurationField()
_EVENT_BATCH = 100  # rows per INSERT, far below any backend's parameter limit
_sql_cache: dict[tuple[Any, ...], str] = {}


def _execute(db: BaseDatabaseWrapper, sql: str, params: list[Any]) -> int:
    """Run one statement; its row count. Like ``QuerySet.update``, an error marks an enclosing
    ``atomic`` block for rollback."""
    with transaction.mark_for_rollback_on_error(db.alias), db.cursor() as cursor:
        cursor.execute(sql, params)
        return cast(int, cursor.rowcount)


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


def _update_sql(db: BaseDatabaseWrapper, shape: tuple[tuple[str, DbValue | None], ...]) -> str:
    """``UPDATE`` of the columns in ``shape`` (a ``DbValue`` or ``None`` for a parameter) under
    the owner guard."""
    key = ("update", db.vendor, shape)
    if key not in _sql_cache:
        if db.vendor not in NOW_SQL:
            raise NotImplementedError(f"no boundary SQL for {db.vendor} (SQLite or PostgreSQL)")
        quote = db.ops.quote_name
        assignments = []
        for name, computed in shape:
            column = quote(RUN_FIELDS[name].column)
            if computed is DbValue.NOW:
                assignments.append(f"{column} = {NOW_SQL[db.vendor]}")
            elif computed is DbValue.LEASE_DEADLINE:
                assignments.append(f"{column} = {DEADLINE_SQL[db.vendor]}")
            elif computed is DbValue.INCREMENT:
                assignments.append(f"{column} = {column} + 1")
            else:
                assignments.append(f"{column} = %s")
        guard = " AND ".join(f"{quote(RUN_FIELDS[name].column)} = %s" for name in _SEGMENT_GUARD)
        _sql_cache[key] = (
            f"UPDATE {quote(AgentRun._meta.db_table)} SET {', '.join(assignments)} WHERE {guard}"
        )
    return _sql_cache[key]


def _segment_update(lease: Lease, values: Mapping[str, Any]) -> bool:
    """The owner-guarded ``UPDATE`` of ``values`` (and ``updated_at``); whether it took the row.

    Guard: ``id``, ``running``, ``claimed_by`` = owner, ``lease_epoch`` = epoch.
    """
    db = connections[DEFAULT_DB_ALIAS]
    shape: list[tuple[str, DbValue | None]] = []
    params: list[Any] = []
    for name, value in {**values, "updated_at": DbValue.NOW}.items():
        if isinstance(value, DbValue):
            shape.append((name, value))
            if value is DbValue.LEASE_DEADLINE:
                deadline = timedelta(seconds=conf.get("LEASE_SECONDS"))
                params.append(_DURATION.get_db_prep_value(deadline, db))
        else:
            shape.append((name, None))
            params.append(RUN_FIELDS[name].get_db_prep_save(value, db))
    params += [lease.run_id, str(Status.RUNNING), lease.owner, lease.epoch]
    return _execute(db, _update_sql(db, tuple(shape)), params) == 1


def segment_write(
    lease: Lease,
    values: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    loop_state: Mapping[str, Any] | None = None,
) -> bool:
    """A segment's own write (the step boundary): one owner-guarded ``UPDATE`` of ``values``
    (and ``updated_at``, and ``loop_state`` when given) in precompiled SQL, then ``events`` signed
    by the lease and numbered from its counter, in one transaction. ``False``: the guard matched
    nothing; nothing was written."""
    if loop_state is not None:
        values = {**values, "loop_state": dict(loop_state)}
    events = list(events)
    if not events:
        return _segment_update(lease, values)
    with transaction.atomic():
        # The lease's head is exact while it is held (like its counter); a lease that does not
        # know it (``None``) reads it first: nobody else appends while the guard can match.
        prev = lease.head if lease.head is not None else ledger.read_head(lease.run_id)[1]
        links, head = ledger.chain(
            run_uuid=lease.uuid,
            prev_hash=prev,
            first_sequence=lease.next_sequence,
            segment=lease.owner,
            lease_epoch=lease.epoch,
            events=events,
        )
        # The head is written by the guarded UPDATE itself: one statement with the state change.
        if not _segment_update(lease, {**values, ledger.HEAD_FIELD: head}):
            return False
        end = insert_events(
            lease.run_id, lease.next_sequence, lease.owner, lease.epoch, events, links
        )
    lease.next_sequence, lease.head = end, head
    return True


def _orm_value(name: str, value: Any) -> Any:
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
    ``run_id`` filtered by ``guard``, then ``events`` numbered from the table (the ``UPDATE`` holds
    the row until commit) and chained from the run's head, which is written with them, in one
    transaction. Events are signed ``segment``/``epoch``, or by ``lease`` (a claim just made),
    whose counter and head then continue after them. ``False``: the guard matched nothing;
    nothing was written.

    ``locked``: the run as the caller read it under its row lock (a decision): the events are
    numbered and chained before the ``UPDATE``, which writes the head itself.

    Inside a caller's transaction (the reaper's batch) the write is a savepoint, so a failure
    undoes only it; ``savepoint=False`` when the caller's transaction is the transition's own."""
    events = list(events)
    signer = (lease.owner, lease.epoch) if lease is not None else (segment, epoch)
    values = {name: _orm_value(name, value) for name, value in values.items()}
    with transaction.atomic(savepoint=savepoint):
        if events and locked is not None:
            first = _next_sequence(run_id)
            prev = getattr(locked, ledger.HEAD_FIELD) or ledger.genesis(locked.uuid)
            links, head = _chain(locked.uuid, prev, first, signer, events)
            values[ledger.HEAD_FIELD] = head
        updated = AgentRun.objects.filter(Q(pk=run_id) & guard).update(**values, updated_at=Now())
        if updated != 1:
            return False
        if events:
            if locked is None:
                first = _next_sequence(run_id)
                # Under the row the UPDATE holds: the stored head is the last event's hash.
                run_uuid, prev = ledger.read_head(run_id)
                links, head = _chain(run_uuid, prev, first, signer, events)
            end = insert_events(run_id, first, *signer, events, links)
            if locked is None:
                ledger.write_head(run_id, head)
            else:
                setattr(locked, ledger.HEAD_FIELD, head)
            if lease is not None:
                lease.next_sequence, lease.head = end, head
    return True


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
