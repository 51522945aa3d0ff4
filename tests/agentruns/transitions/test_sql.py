"""The transitions' named statements (``agentruns/transitions/sql``): what they store is what
the ORM would store, so every comparison and lookup written against ORM rows holds for it —
above all the lease deadline, kept as text on SQLite and compared as text with ``Now()``.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.test import override_settings

from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, Effect, EventKind
from agentruns.transitions import run_clear_fence, run_heartbeat, run_reclaim_stale, run_stamp_fence
from agentruns.transitions._statements import of_vendor
from tests.agentruns.support.transitions import CALL, REAPER, events, reaper_event, start

pytestmark = pytest.mark.django_db

STATE = {"text": 'é ü 中 "quoted" \\', "nested": {"n": [1, None, 2.5, True]}, "empty": {}}


def lease_seconds(seconds: float):
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEASE_SECONDS": seconds})


def stored(table: str, column: str, row_id: int) -> object:
    """The column as the database holds it, as text (no converter of the driver in between)."""
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT CAST("{column}" AS TEXT) FROM "{table}" WHERE "id" = %s', [row_id])
        return cursor.fetchone()[0]


def lease_deadline() -> ExpressionWrapper:
    """``Now() + LEASE_SECONDS`` as the ORM writes it."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=settings.AGENTRUNS.get("LEASE_SECONDS", 60))),
        output_field=DateTimeField(),
    )


CLOCKS = re.compile(
    r"\b(now|current_timestamp|clock_timestamp|statement_timestamp|transaction_timestamp"
    r"|localtimestamp|julianday|unixepoch)\b",
    re.IGNORECASE,
)


def test_every_statement_reads_the_clock_as_django_compiles_now():
    """Pinned against the installed Django: a change in how it writes the clock shows up here.
    The statements read no other clock (a deadline is that clock plus seconds)."""
    query = AgentRun.objects.all().query
    compiler = query.get_compiler(connection=connection)
    now_sql, now_params = compiler.compile(Now().resolve_expression(query))
    assert now_params == []
    reading = now_sql.removesuffix(")")  # SQLite: the same call, with a modifier, for a deadline

    used = 0
    for name, statement in of_vendor(connection.vendor).items():
        used += statement.count(reading)
        assert not CLOCKS.search(statement.replace(reading, "")), name
    assert used > 0


def test_a_boundary_deadline_is_the_database_clock_plus_the_lease():
    lease = start()

    with lease_seconds(45):
        assert run_heartbeat(lease)

    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.lease_expires - run.updated_at == timedelta(seconds=45)  # one statement, one clock


def test_a_boundary_deadline_expires_on_the_database_clock_once_time_passes():
    lease = start()
    with lease_seconds(1):
        assert run_heartbeat(lease)

    assert not AgentRun.objects.filter(pk=lease.run_id, lease_expires__lt=Now()).exists()
    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is False
    time.sleep(1.1)
    assert AgentRun.objects.filter(pk=lease.run_id, lease_expires__lt=Now()).exists()
    assert run_reclaim_stale(run_id=lease.run_id, segment=REAPER, event=reaper_event()) is True


def test_a_sub_second_deadline_compares_with_now_as_the_orm_s_does():
    """On SQLite ``Now()`` has milliseconds and a deadline microseconds: still ordered right."""
    past, future = start(), start()

    with lease_seconds(0.001):  # a lease is positive (agentruns.E003): the shortest, run out
        assert run_heartbeat(past)
    time.sleep(0.2)
    with lease_seconds(30):
        assert run_heartbeat(future)

    stale = set(AgentRun.objects.filter(lease_expires__lt=Now()).values_list("pk", flat=True))
    assert past.run_id in stale
    assert future.run_id not in stale


def test_boundary_timestamps_are_stored_in_the_orm_s_text_format():
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL stores timestamptz, not text")
    orm_written, boundary = start(), start()
    AgentRun.objects.filter(pk=orm_written.run_id).update(
        lease_expires=lease_deadline(), updated_at=Now()
    )
    assert run_heartbeat(boundary, events=[EventSpec(EventKind.LLM)])

    def shape(value: object) -> str:
        # ``str(datetime)`` omits a zero fraction (1 in 1000 deadlines): restore it, then keep
        # only the pattern, e.g. ``9999-99-99 99:99:99.999999``.
        text = re.sub(r"(:\d\d)(?=$|\+)", r"\1.000000", str(value))
        return re.sub(r"\d", "9", text)

    table = AgentRun._meta.db_table
    for column in ("lease_expires", "updated_at"):
        assert shape(stored(table, column, boundary.run_id)) == shape(
            stored(table, column, orm_written.run_id)
        ), column
    orm_event, boundary_event = (
        AgentRunEvent.objects.filter(run_id=run_id).latest("sequence").pk
        for run_id in (orm_written.run_id, boundary.run_id)
    )
    event_table = AgentRunEvent._meta.db_table
    assert shape(stored(event_table, "created_at", boundary_event)) == shape(
        stored(event_table, "created_at", orm_event)
    )


def test_boundary_json_is_stored_as_the_orm_stores_it_and_answers_json_lookups():
    lease, other = start(), start()
    AgentRun.objects.filter(pk=other.run_id).update(loop_state=STATE, pending_call=CALL)

    assert run_stamp_fence(lease, effect=Effect.NON_IDEMPOTENT_WRITE, call=CALL, loop_state=STATE)

    table = AgentRun._meta.db_table
    for column in ("loop_state", "pending_call"):
        assert stored(table, column, lease.run_id) == stored(table, column, other.run_id), column
    run = AgentRun.objects.get(pk=lease.run_id)
    assert run.loop_state == STATE and run.pending_call == CALL
    assert AgentRun.objects.filter(pk=lease.run_id, loop_state__text=STATE["text"]).exists()
    assert AgentRun.objects.filter(pk=lease.run_id, pending_call__name=CALL["name"]).exists()

    assert run_clear_fence(lease)

    # SQL NULL, as the ORM writes None into a JSONField: not the JSON value null.
    assert AgentRun.objects.filter(pk=lease.run_id, pending_call__isnull=True).exists()
    assert stored(table, "pending_call", lease.run_id) is None


def test_boundary_event_payloads_are_stored_as_the_orm_stores_them():
    lease = start()
    orm_event = AgentRunEvent.objects.create(
        run_id=lease.run_id, sequence=100, kind=EventKind.TOOL, payload=STATE
    )

    assert run_heartbeat(lease, events=[EventSpec(EventKind.TOOL, STATE, duration_ms=7)])

    written = AgentRunEvent.objects.get(run_id=lease.run_id, sequence=1)
    table = AgentRunEvent._meta.db_table
    assert stored(table, "payload", written.pk) == stored(table, "payload", orm_event.pk)
    assert (written.kind, written.payload, written.duration_ms) == (EventKind.TOOL, STATE, 7)
    assert AgentRunEvent.objects.filter(pk=written.pk, payload__nested__n__1=None).exists()


def test_many_events_at_one_boundary_are_inserted_in_batches_in_sequence():
    lease = start()

    assert run_heartbeat(lease, events=[EventSpec(EventKind.TOOL, {"n": n}) for n in range(250)])

    written = events(lease.run_id)
    assert [sequence for sequence, *_ in written] == list(range(251))
    assert lease.next_sequence == 251
    payloads = AgentRunEvent.objects.filter(run_id=lease.run_id, sequence__gte=1)
    assert [e.payload["n"] for e in payloads.order_by("sequence")] == list(range(250))
