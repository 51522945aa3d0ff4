"""The writer behind ``agentruns.transitions``. Private: only the transitions call it.

``write`` executes one named statement (``_statements``: ``sql/postgresql.sql`` and
``sql/sqlite.sql``) with its parameters bound and returns the run's row as the statement returns
it, or ``None`` when its guard matched nothing (nothing was written). A transition names its
statement and its parameters; the three ways a write appends its events differ only in where
the run's ledger tail comes from:

* ``segment_write`` — a segment's own write under its lease: the events are chained from the
  lease's head and counter before the statement, whose guard pins the counter.
* ``locked_write`` — a decision on a row read under its lock: chained from the locked row.
* ``guarded_write`` — any other guard: the statement returns the run's tail under the row it now
  holds; the events are chained from it, appended, and the new tail written, in its transaction.

A statement that takes ``%(events)s`` appends them itself (PostgreSQL: the ``UPDATE`` and the
``INSERT`` are one statement); otherwise they are appended (``append_events``) after it, in one
transaction (SQLite).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, ParamSpec, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DEFERRED, Field, Model

from agentruns import ledger
from agentruns.conf import app_settings
from agentruns.exceptions import LeaseholdError, StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentConfiguration, AgentRun, AgentRunEvent
from agentruns.transitions._statements import appends_events, sql

try:  # psycopg 3's cursor that binds parameters on the server (``_cursor``)
    from psycopg import Cursor as ServerBindingCursor
except ImportError:  # pragma: no cover - no PostgreSQL driver
    ServerBindingCursor = None  # type: ignore[assignment,misc]

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=Model)

RUN_FIELDS: dict[str, Field[Any, Any]] = {f.name: f for f in AgentRun._meta.concrete_fields}
_COLUMNS: dict[type[Model], dict[str, Field[Any, Any]]] = {
    model: {f.column: f for f in model._meta.concrete_fields}
    for model in (AgentRun, AgentConfiguration)
}
_ATTNAMES: dict[type[Model], list[str]] = {
    model: [f.attname for f in model._meta.concrete_fields] for model in _COLUMNS
}
_CREATED_AT = AgentRunEvent._meta.get_field("created_at")
#: A last column a statement may return: the run's events (``known_events``).
KNOWN_EVENTS = "known_events"
#: The parameters of a write that appends no events: its ledger tail is kept.
NO_EVENTS: dict[str, Any] = {"first_sequence": None, "head": None, "next_sequence": None}


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


def lease_seconds() -> float:
    """How long a lease runs from the database clock (``LEASE_SECONDS``): the parameter
    ``%(lease_seconds)s`` of the statements that take or renew one."""
    return app_settings().lease_seconds


def json_text(value: Any) -> str:
    """A JSON column's value as Django's ``JSONField`` writes it (``json.dumps``), for a JSON
    array parameter that carries it (``%(events)s``, ``%(runs)s``)."""
    return json.dumps(value)


# --- Executing a named statement -----------------------------------------------------------------


def _cursor(db: BaseDatabaseWrapper) -> Any:
    """PostgreSQL: psycopg's cursor that binds the parameters on the server (sent beside the
    statement rather than quoted into it by the client) as one unnamed statement, which keeps
    nothing in the server session (safe behind a transaction-mode pooler); wrapped by Django as
    its own cursors are (query log, execute wrappers, error translation). Elsewhere Django's."""
    if db.vendor != "postgresql" or ServerBindingCursor is None:
        return db.cursor()
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    raw: Any = ServerBindingCursor(db.connection)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)


def _bound(db: BaseDatabaseWrapper, name: str, value: Any) -> Any:
    """A parameter named after a run column is adapted by its model field (JSON, decimals,
    uuids as Django stores them); ``None`` stays SQL ``NULL``; others are passed as they are."""
    field = RUN_FIELDS.get(name)
    if field is None or value is None:
        return value
    return field.get_db_prep_save(value, db)


def execute(statement: str, params: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """Execute the named ``statement`` with ``params`` bound; the names of the columns it
    returns and its rows. An error marks an enclosing ``atomic`` block for rollback."""
    db = connections[DEFAULT_DB_ALIAS]
    bound = {name: _bound(db, name, value) for name, value in params.items()}
    with transaction.mark_for_rollback_on_error(db.alias), _cursor(db) as cursor:
        cursor.execute(sql(db, statement), bound)
        description = cursor.description  # psycopg builds it anew on every access: read once
        if description is None:
            return [], []
        return [column[0] for column in description], cursor.fetchall()


def write(statement: str, params: Mapping[str, Any]) -> AgentRun | None:
    """The writer: execute the named guarded ``statement`` with ``params`` bound. The run's row
    as the statement returns it — the columns it returns loaded, the others deferred (loaded on
    first access), and its configuration when the statement returns that too (after the run's
    columns) — or ``None``: the guard matched nothing, and nothing was written."""
    names, rows = execute(statement, params)
    if not rows:
        return None
    return _row(connections[DEFAULT_DB_ALIAS], names, rows[0])


def written_row(names: list[str], values: Sequence[Any]) -> AgentRun:
    """The run of a row a named statement returned (``execute``), as ``write`` builds it."""
    return _row(connections[DEFAULT_DB_ALIAS], names, values)


def _row(db: BaseDatabaseWrapper, names: list[str], values: Sequence[Any]) -> AgentRun:
    """The run of a returned row; the columns after its own (from the first repeated name on)
    are its configuration's; a last column ``known_events`` is kept for ``known_events``."""
    events = None
    if names and names[-1] == KNOWN_EVENTS:
        names, values, events = names[:-1], values[:-1], values[-1]
    split = len(names)
    for index, name in enumerate(names):
        if name in names[:index] or name not in _COLUMNS[AgentRun]:
            split = index
            break
    run = _instance(db, AgentRun, names[:split], values[:split])
    if split < len(names) and values[split] is not None:
        run.configuration = _instance(db, AgentConfiguration, names[split:], values[split:])
    if events is not None:
        run.__dict__[KNOWN_EVENTS] = events
    return run


def known_events(row: AgentRun) -> list[AgentRunEvent] | None:
    """The run's events a statement returned with ``row`` as its last column ``known_events``
    (a JSON array of ``[sequence, kind, payload]``, in sequence order: ``decide_resume`` on
    PostgreSQL), as events a transcript rebuilds from; ``None`` when it returned none."""
    raw = row.__dict__.get(KNOWN_EVENTS)
    if not isinstance(raw, str):
        return None
    return [
        AgentRunEvent(run_id=row.pk, sequence=sequence, kind=kind, payload=payload)
        for sequence, kind, payload in json.loads(raw)
    ]


def _instance(
    db: BaseDatabaseWrapper, model: type[M], names: list[str], values: Sequence[Any]
) -> M:
    """A ``model`` instance from a row's columns, each value converted as the ORM converts a
    value it reads (the backend's converters, then the field's ``from_db_value``)."""
    loaded: dict[str, Any] = {}
    for (attname, col, converters), value in zip(
        _converters(db, model, tuple(names)), values, strict=True
    ):
        for convert in converters:
            value = convert(value, col, db)
        loaded[attname] = value
    fields = _ATTNAMES[model]
    return model.from_db(db.alias, fields, [loaded.get(name, DEFERRED) for name in fields])


@functools.lru_cache(maxsize=256)
def _converters(
    db: BaseDatabaseWrapper, model: type[Model], names: tuple[str, ...]
) -> list[tuple[str, Any, list[Any]]]:
    """Per returned column of ``model``: its attribute name, its column expression and the
    converters the ORM applies to a value read from it (the backend's, then the field's). The
    same for every row a statement returns on one connection: found once per column list."""
    columns = _COLUMNS[model]
    found = []
    for name in names:
        field = columns[name]
        col = field.get_col(model._meta.db_table)
        found.append(
            (field.attname, col, [*db.ops.get_db_converters(col), *col.get_db_converters(db)])
        )
    return found


def show(run: AgentRun, row: AgentRun) -> None:
    """Make ``run`` (read under its row lock) show ``row``, what its write returned, without a
    read back: the columns the write returned; its cached relations (the configuration read
    with the lock) are kept."""
    for field in AgentRun._meta.concrete_fields:
        if field.attname in row.__dict__:
            setattr(run, field.attname, row.__dict__[field.attname])


# --- Events ------------------------------------------------------------------------------------


def event_row(
    db: BaseDatabaseWrapper,
    sequence: int,
    spec: EventSpec,
    signer: tuple[str, int],
    chained: ledger.Link,
    run_id: int | None = None,
) -> dict[str, Any]:
    """One event as an element of ``%(events)s``: its ``created_at`` and key id as its link in
    the chain fixed them (the hash covers them), its payload as JSON text (as Django writes
    it). ``run_id`` ``None``: the run of the write that appends it."""
    created = _CREATED_AT.get_db_prep_value(chained.created_at, db)
    return {
        "run": run_id,
        "sequence": sequence,
        "kind": str(spec.kind),
        "segment": signer[0],
        "lease_epoch": signer[1],
        "duration_ms": spec.duration_ms,
        "payload": json_text(spec.payload),
        "actor": spec.actor_id,
        "created_at": created if isinstance(created, str) else created.isoformat(),
        "prev_hash": chained.prev_hash,
        "hash": chained.hash,
        "ledger_version": ledger.VERSION,
        "ledger_key": chained.key_id,
    }


def event_rows(
    first: int, signer: tuple[str, int], events: list[EventSpec], links: list[ledger.Link]
) -> list[dict[str, Any]]:
    """``events`` numbered from ``first`` with their ``links`` in the chain (``event_row``)."""
    if len(links) != len(events):
        raise ValueError("every event needs its link in the chain")
    db = connections[DEFAULT_DB_ALIAS]
    return [
        event_row(db, first + offset, spec, signer, links[offset])
        for offset, spec in enumerate(events)
    ]


def append_events(rows: Iterable[dict[str, Any]]) -> None:
    """Append event rows (``event_row``, each naming its run) in one statement."""
    rows = list(rows)
    if rows:
        execute("append_events", {"events": json.dumps(rows, ensure_ascii=False)})


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


def write_with_events(
    statement: str,
    params: Mapping[str, Any],
    rows: list[dict[str, Any]],
    *,
    savepoint: bool = True,
    commit: bool = False,
) -> AgentRun | None:
    """``write(statement)`` and the event ``rows`` (of the run it writes) in one transaction:
    one statement when it appends them itself (in autocommit its own transaction, unless
    ``commit``; in a caller's, a savepoint unless not ``savepoint``), else ``append_events``
    after it."""
    db = connections[DEFAULT_DB_ALIAS]
    if appends_events(db, statement):
        own = db.in_atomic_block or commit
        with transaction.atomic(savepoint=savepoint) if own else nullcontext():
            return write(statement, {**params, "events": json.dumps(rows, ensure_ascii=False)})
    with transaction.atomic(savepoint=savepoint):
        row = write(statement, params)
        if row is not None:
            append_events({**event, "run": row.pk} for event in rows)
        return row


# --- The three ways a write appends events ---------------------------------------------------


def segment_write(
    lease: Lease,
    statement: str,
    params: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    await_commit: bool = False,
) -> AgentRun | None:
    """A segment's own write under ``lease`` (its owner guard: ``%(run_id)s``, ``%(owner)s``,
    ``%(epoch)s``), appending ``events`` signed by the lease, numbered from its counter and
    chained from its head; the statement's guard then also pins the counter
    (``%(first_sequence)s``) and it writes the new head and counter. ``None``: the guard
    matched nothing (the lease is lost); nothing was written.

    On PostgreSQL the write is one statement, in autocommit: an autocommit statement the
    database has received completes even if the process that sent it dies meanwhile, and its
    guard still decides. ``await_commit`` keeps a write with events in a transaction the segment
    commits itself, so a death before that ``COMMIT`` undoes it (the boundary that records a
    non-idempotent write: the run is then in doubt, §9.1). On SQLite the statement and the
    events' INSERT are two statements in one (IMMEDIATE) transaction.
    """
    params = {**params, "run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch}
    events = list(events)
    if not events:
        return write(statement, {**params, **NO_EVENTS, "events": "[]"})
    if lease.head is None:
        # A lease that does not know the head (and so its counter) reads both from the row:
        # nobody else appends while the guard can match (and if someone did, the sequence in
        # the guard refuses the write).
        _, lease.head, lease.next_sequence = ledger.read_tail(lease.run_id)
    first, signer = lease.next_sequence, (lease.owner, lease.epoch)
    links, head = _chain(lease.uuid, lease.head, first, signer, events)
    tail = {"first_sequence": first, "head": head, "next_sequence": first + len(events)}
    row = write_with_events(
        statement, {**params, **tail}, event_rows(first, signer, events, links), commit=await_commit
    )
    if row is not None:
        lease.next_sequence, lease.head = first + len(events), head
    return row


def locked_write(
    run: AgentRun,
    statement: str,
    params: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    signer: tuple[str, int],
    lease: Lease | None = None,
) -> AgentRun | None:
    """A write on ``run``, read under its row lock in the caller's transaction (a decision, a
    deadline, a check): ``events`` signed ``signer`` (segment, epoch), numbered from the locked
    row's counter and chained from its head, written with the new head and counter by the
    same statement (no read). ``lease`` (a claim the write makes) continues after them.
    ``None``: the guard matched nothing; nothing was written."""
    params = {**params, "run_id": run.pk}
    events = list(events)
    if not events:
        return write(statement, {**params, **NO_EVENTS, "events": "[]"})
    first = run.next_sequence
    links, head = _chain(
        run.uuid, run.ledger_head or ledger.genesis(run.uuid), first, signer, events
    )
    tail = {"first_sequence": first, "head": head, "next_sequence": first + len(events)}
    rows = event_rows(first, signer, events, links)
    row = write_with_events(statement, {**params, **tail}, rows, savepoint=False)
    if row is not None and lease is not None:
        lease.next_sequence, lease.head = first + len(events), head
    return row


def guarded_write(
    statement: str,
    params: Mapping[str, Any],
    events: Iterable[EventSpec] = (),
    *,
    segment: str = "",
    epoch: int = 0,
    savepoint: bool = True,
) -> AgentRun | None:
    """Any other guarded write, in one transaction: the statement (returning the run's uuid,
    ledger head and next sequence under the row it now holds), then ``events`` signed
    ``segment``/``epoch``, numbered and chained from that tail, and the new tail
    (``write_tail``). ``None``: the guard matched nothing; nothing was written. Inside a
    caller's transaction (the reaper's batch) the write is a savepoint, so a failure undoes
    only it; ``savepoint=False`` when the caller's transaction is the transition's own."""
    events = list(events)
    with transaction.atomic(savepoint=savepoint):
        row = write(statement, params)
        if row is None or not events:
            return row
        first, signer = row.next_sequence, (segment, epoch)
        links, head = _chain(
            row.uuid, row.ledger_head or ledger.genesis(row.uuid), first, signer, events
        )
        append_events(
            {**event, "run": row.pk} for event in event_rows(first, signer, events, links)
        )
        execute(
            "write_tail", {"run_id": row.pk, "head": head, "next_sequence": first + len(events)}
        )
    return row
