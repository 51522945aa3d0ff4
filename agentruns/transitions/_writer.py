"""The two writers behind ``agentruns.transitions``. Private: only the transitions call them.

* ``segment_write`` — a segment's own writes under its lease (the step boundary), in
  precompiled SQL.
* ``guarded_write`` — any other guard, through the ORM.

Both add ``updated_at``, take database-computed values as ``DbValue`` (the clock, the lease
deadline, an increment) and append events in the same transaction as the guarded ``UPDATE``,
chained by ``agentruns.ledger`` (each event's ``prev_hash`` and ``hash``; the run's head written
in the segment's own ``UPDATE``, or in the transaction of any other guarded write). The SQL
they share with the claim and the reaper's batches is in ``_sql``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now

from agentruns import ledger
from agentruns.conf import app_settings
from agentruns.exceptions import LeaseholdError, StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, Status
from agentruns.transitions._sql import (
    DEADLINE_SQL,
    EVENT_BATCH,
    EVENTS_GUARD,
    NOW_SQL,
    RUN_FIELDS,
    DbValue,
    Later,
    boundary_sql,
    event_rows,
    events_insert_sql,
    insert_events,
    orm_update_sql,
    run_columns,
    run_statement,
    update_parts,
    update_sql,
    with_events_sql,
)

# Re-exported: the transitions name database-computed values and the clock's SQL from here.
__all__ = [
    "DEADLINE_SQL",
    "NOW_SQL",
    "DbValue",
    "Later",
    "guarded_write",
    "lease_deadline",
    "segment_write",
    "stale",
    "state_write",
]

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
        Now() + Value(timedelta(seconds=app_settings().lease_seconds)),
        output_field=DateTimeField(),
    )


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
    shape, params = update_parts(db, values)
    sql, params = update_sql(db, shape), params + _owner(lease)
    if written is None:
        return run_statement(db, sql, params) == 1
    return _returned(f"{sql} RETURNING {run_columns(db)}", params, written)


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
    ``UPDATE`` and the INSERT are one statement (``boundary_sql``) in autocommit: there is no
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
    shape, params = update_parts(
        db, {**values, ledger.HEAD_FIELD: head, ledger.SEQUENCE_FIELD: end}
    )
    guard = [*_owner(lease), first]
    if db.vendor == "postgresql" and len(events) <= EVENT_BATCH:
        rows = event_rows(db, lease.run_id, first, (lease.owner, lease.epoch), events, links)
        sql = boundary_sql(db, shape, len(events))
        if written is not None:  # the row as the UPDATE left it, from the same statement
            update = update_sql(db, shape, EVENTS_GUARD)
            columns = run_columns(db)
            sql = (
                f"WITH u AS ({update} RETURNING {columns}), "
                f"e AS ({events_insert_sql(db, len(events))}) SELECT {columns} FROM u"
            )
        with transaction.atomic() if db.in_atomic_block or await_commit else nullcontext():
            # Inside a caller's transaction a failure undoes only this (a savepoint); in
            # autocommit the statement is its own transaction (no BEGIN/COMMIT).
            if written is None:
                taken = run_statement(db, sql, params + guard + rows) == len(events)
            else:
                taken = _returned(sql, params + guard + rows, written)
        if not taken:
            return False
    else:
        with transaction.atomic():
            update = update_sql(db, shape, EVENTS_GUARD)
            if written is None:
                taken = run_statement(db, update, params + guard) == 1
            else:
                taken = _returned(f"{update} RETURNING {run_columns(db)}", params + guard, written)
            if not taken:
                return False
            insert_events(lease.run_id, first, lease.owner, lease.epoch, events, links)
    lease.next_sequence, lease.head = end, head
    return True


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
            if db.vendor == "postgresql" and len(events) <= EVENT_BATCH:
                # The UPDATE (as the ORM compiles it) and the events in one statement.
                update, params = orm_update_sql(run_id, guard, {**values, "updated_at": Now()})
                rows = event_rows(db, run_id, first, signer, events, links)
                sql = with_events_sql(db, update, len(events))
                if run_statement(db, sql, params + rows) != len(events):
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
    update, params = orm_update_sql(run_id, guard, values)
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
