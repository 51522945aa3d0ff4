"""PostgreSQL: with ``PREPARED_STATEMENTS`` on, the step boundary's statements are prepared on
the server (docs/design.md §6.6) and still appear in Django's query log; with it off (the
default, safe behind a transaction-mode pooler that keeps no prepared statements) nothing is.

``own_session``: the tests read their connection's prepared statements (``pg_prepared_statements``
of its server session), which behind a transaction-mode pooler is whichever server session the
query lands on; CI's pass through PgBouncer deselects them (transitions/test_sql_pooler.py runs
the setting through one)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from agentruns.conf import DEFAULTS
from agentruns.models import AgentRun, Status
from agentruns.services.runs import run_start_sync
from tests.agentruns.support.runtime import call, config, tool_turn

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.own_session,
    pytest.mark.django_db(transaction=True),  # autocommit, as in production
    pytest.mark.usefixtures("probes"),
]


def _run_reads(rounds: int = 3) -> AgentRun:
    script = [tool_turn(call("probe_read", value=str(n))) for n in range(rounds)]
    result = run_start_sync(
        configuration=config(),
        prompt="read",
        options={"script": [*script, {"content": "done"}]},
    )
    assert result.run.status == Status.COMPLETED
    return result.run


def _prepared_boundaries() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall() if row[0].startswith("WITH u AS (UPDATE")]


def _settings(prepared: bool) -> dict:
    from django.conf import settings

    return {
        "AGENTRUNS": {**getattr(settings, "AGENTRUNS", DEFAULTS), "PREPARED_STATEMENTS": prepared}
    }


def test_boundaries_are_prepared_once_and_still_logged_with_their_sql():
    connection.close()  # a connection of its own: no statement prepared by another test
    with override_settings(**_settings(True)):
        _run_reads()
        prepared = _prepared_boundaries()
        assert prepared, "no boundary statement was prepared"
        with CaptureQueriesContext(connection) as captured:
            _run_reads()
    boundaries = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("WITH u AS")]
    # The second run executes the prepared statements (by name) and the log still shows them.
    assert len(boundaries) >= 6
    assert all('"agentruns_agentrun"' in sql for sql in boundaries)
    # ... and prepared nothing new: each statement was prepared once per connection.
    assert set(_prepared_boundaries()) == set(prepared)
    # Django's own queries (client-side binding) are never prepared.
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert not [s for s in statements if s.lstrip().upper().startswith("SELECT")]


def test_with_the_setting_off_nothing_is_prepared():
    connection.close()
    with override_settings(**_settings(False)):
        _run_reads()
        _run_reads()
        assert _prepared_boundaries() == []
