"""What the worker's task reads of the run row (docs/design.md §10): the claim reads it once,
by uuid, and once more for the ledger head under the row its UPDATE holds (a head read before
that UPDATE could be stale: a redispatch appends to a queued run without changing what the
claim's guard compares); the segment loads it once; the task, which reports only the outcome,
does not read it again at the end. A caller that wants the run after the segment still gets it
read afresh."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns import tasks
from agentruns.models import AgentRun, Status
from agentruns.services import runs
from tests.agentruns.factories import AgentConfigurationFactory

pytestmark = pytest.mark.django_db

ANSWER = [{"content": "done"}]


def queued_run() -> AgentRun:
    return runs.run_enqueue(
        configuration=AgentConfigurationFactory(tools=[]),
        prompt="do it",
        options={"script": ANSWER},
    )


def run_row_reads(queries: CaptureQueriesContext) -> int:
    table = f'FROM "{AgentRun._meta.db_table}"'
    return sum(
        1
        for query in queries.captured_queries
        if query["sql"].lstrip().upper().startswith("SELECT") and table in query["sql"]
    )


def test_the_task_reads_the_run_row_twice_the_claim_and_the_segment():
    run = queued_run()

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "completed"

    # The claim's UPDATE returns the ledger head and the next sequence (no SELECT of them).
    assert run_row_reads(queries) == 2
    assert AgentRun.objects.get(pk=run.pk).status == Status.COMPLETED


def test_a_caller_of_the_service_gets_the_run_as_the_segment_left_it():
    run = queued_run()

    with CaptureQueriesContext(connection) as queries:
        result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == "completed"
    assert result.run.status == Status.COMPLETED  # read again at the end
    assert run_row_reads(queries) == 3


def test_a_task_for_a_run_that_is_not_queued_reads_it_once_and_does_nothing():
    run = queued_run()
    assert tasks.process_run(str(run.uuid)) == "completed"

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "not claimed"
        assert tasks.process_run("not-a-uuid") == "not claimed"

    assert run_row_reads(queries) == 1
    assert [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"]] == []
