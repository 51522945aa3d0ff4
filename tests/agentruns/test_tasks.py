"""What the worker's task reads and writes of the run (docs/design.md §10): the claim is one
statement that takes the run and hands back the row as claimed with its configuration (a run
never claimed is tried as such, without a read: ``lease_epoch`` 0, no events, the genesis head
are part of the guard); the segment reads neither again, nor, on a first claim, the events (the
claim's own are all there are); the task, which reports only the outcome, does not read the run
at the end. A run claimed before (requeued, or queued again by a decision) is read once first.
A caller that wants the run after the segment still gets it read afresh."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns import audit, tasks, transitions
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services import runs
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.transitions import claim_lease, events, snapshot

pytestmark = pytest.mark.django_db

ANSWER = [{"content": "done"}]


def queued_run() -> AgentRun:
    return runs.run_enqueue(
        configuration=AgentConfigurationFactory(tools=[]),
        prompt="do it",
        options={"script": ANSWER},
    )


def reads(queries: CaptureQueriesContext, model: type[AgentRun] | type[AgentRunEvent]) -> int:
    table = f'FROM "{model._meta.db_table}"'
    return sum(
        1
        for query in queries.captured_queries
        if query["sql"].lstrip().upper().startswith("SELECT") and table in query["sql"]
    )


def run_row_reads(queries: CaptureQueriesContext) -> int:
    return reads(queries, AgentRun)


def claims(queries: CaptureQueriesContext) -> int:
    """Statements that try to claim the run (each a guarded UPDATE setting it running)."""
    return sum(1 for q in queries.captured_queries if "SET status = 'running'" in _unquoted(q))


def _unquoted(query: dict[str, str]) -> str:
    """A logged statement without its names' quotes (Django quotes them; the named statements
    of ``agentruns/transitions/sql`` do not)."""
    return query["sql"].replace('"', "")


def test_a_first_claim_reads_neither_the_run_nor_its_events():
    run = queued_run()

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "completed"

    assert run_row_reads(queries) == 0
    assert reads(queries, AgentRunEvent) == 0
    assert claims(queries) == 1
    assert AgentRun.objects.get(pk=run.pk).status == Status.COMPLETED
    assert audit.verify(run_uuid=run.uuid).broken == []


def test_a_caller_of_the_service_gets_the_run_as_the_segment_left_it():
    run = queued_run()

    with CaptureQueriesContext(connection) as queries:
        result = runs.run_process_queued(run_uuid=run.uuid)

    assert result is not None and result.outcome == "completed"
    assert result.run.status == Status.COMPLETED  # read again at the end
    assert run_row_reads(queries) == 1


def test_a_run_claimed_before_is_read_once_and_its_events_once():
    run = queued_run()
    lease = claim_lease(run_id=run.pk, identity="worker:gone:1")
    assert lease is not None
    assert transitions.run_requeue(lease, error={"type": "Timeout"})

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "completed"

    assert run_row_reads(queries) == 1
    assert reads(queries, AgentRunEvent) == 1
    assert claims(queries) == 2  # as never claimed: nothing matched; then as read
    after = AgentRun.objects.get(pk=run.pk)
    assert (after.status, after.lease_epoch) == (Status.COMPLETED, 2)
    second = [kind for _, kind, _, epoch in events(run.pk) if epoch == 2]
    assert second[0] == EventKind.LEASE
    assert audit.verify(run_uuid=run.uuid).broken == []


def test_an_event_appended_to_a_queued_run_is_chained_after_by_the_claim():
    """A redispatch appends to a run that is still queued and never claimed: the claim's guard
    (which pins the next sequence and the head) refuses the guess and claims from the row."""
    run = queued_run()
    assert transitions.run_mark_redispatched(
        run_id=run.pk,
        older_than_seconds=-60,
        segment="reaper:r:1",
        event=EventSpec(EventKind.REAPER, {"rule": "redispatch"}),
    )

    assert tasks.process_run(str(run.uuid)) == "completed"

    assert [kind for _, kind, _, _ in events(run.pk)][:2] == [EventKind.REAPER, EventKind.LEASE]
    assert audit.verify(run_uuid=run.uuid).broken == []


def test_a_task_for_a_run_that_is_not_queued_changes_nothing():
    run = queued_run()
    assert tasks.process_run(str(run.uuid)) == "completed"
    before, stream = snapshot(run.pk), events(run.pk)

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "not claimed"
        assert tasks.process_run("not-a-uuid") == "not claimed"

    # The claim tried as never claimed (matching nothing), then one read: not queued.
    assert claims(queries) == 1
    assert run_row_reads(queries) == 1
    assert snapshot(run.pk) == before
    assert events(run.pk) == stream


@pytest.mark.postgres
def test_on_postgresql_a_first_claim_is_one_statement_with_its_event_and_configuration():
    run = queued_run()

    with CaptureQueriesContext(connection) as queries:
        assert tasks.process_run(str(run.uuid)) == "completed"

    (claim,) = [
        _unquoted(q) for q in queries.captured_queries if "SET status = 'running'" in _unquoted(q)
    ]
    assert "INSERT INTO agentruns_agentrunevent" in claim
    assert "JOIN agentruns_agentconfiguration" in claim
    sequence, kind, _, epoch = events(run.pk)[0]
    assert (sequence, kind, epoch) == (0, EventKind.LEASE, 1)


def test_a_segment_lists_the_tools_it_offers_once_not_every_round():
    """Offering every tool reads the enabled MCP servers; a segment does that once, not once per
    provider request (whether a call may run is still resolved afresh for every call)."""
    from agentruns.services.runs import run_start_sync
    from tests.agentruns.factories import AgentConfigurationFactory

    turn = {"tool_calls": [{"name": "list_notes"}]}
    configuration = AgentConfigurationFactory(
        tools=[], script=[turn, turn, turn, {"content": "ok"}]
    )
    with CaptureQueriesContext(connection) as captured:
        run_start_sync(configuration=configuration, prompt="go")
    servers = [q for q in captured.captured_queries if '"agentruns_mcpserver"' in q["sql"]]
    assert len(servers) == 1, [q["sql"][:80] for q in servers]
