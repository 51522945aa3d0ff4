"""What a decision reads (docs/design.md §6.6): the waiting run once, under its row lock — the
approval event names the calls from that locked row, and the decided run is not read back."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns.leases import EventSpec
from agentruns.models import AgentRun, AgentRunEvent, EventKind, Status
from agentruns.services.runs import run_decide as service_decide
from agentruns.services.runs import run_start_sync
from agentruns.services.runtime.results import Outcome
from agentruns.transitions import locked_waiting_run, record_decision, run_decide
from agentruns.turns import ApprovalDecision
from tests.agentruns.support.runtime import call, config, decider, tool_turn
from tests.agentruns.support.transitions import DIGEST, start, suspend

pytestmark = pytest.mark.django_db

RESUMER = "resume:host-c:300"


def statements(captured: CaptureQueriesContext) -> Counter:
    """The statements issued, but for BEGIN/COMMIT."""
    kinds = Counter(query["sql"].split(None, 1)[0].upper() for query in captured.captured_queries)
    return Counter({k: n for k, n in kinds.items() if k not in {"BEGIN", "COMMIT"}})


@pytest.mark.django_db(transaction=True)  # the decision's own transaction, not a test savepoint
@pytest.mark.parametrize("identity", [RESUMER, None], ids=["inline", "queued"])
def test_a_decision_reads_the_run_once_and_does_not_read_it_back(identity):
    lease = start()
    suspend(lease)

    with CaptureQueriesContext(connection) as captured:
        decided = run_decide(
            run_uuid=lease.uuid,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=DIGEST,
            decision=ApprovalDecision(approved=True),
            event=EventSpec(EventKind.APPROVAL, {"turn_digest": DIGEST}),
            identity=identity,
        )

    # The locked row (its next sequence and ledger head too: no MAX(sequence)), the guarded
    # UPDATE, the event; no savepoint.
    # On PostgreSQL the UPDATE and the INSERT are one statement (a data-modifying CTE).
    writes = {"WITH": 1} if connection.vendor == "postgresql" else {"UPDATE": 1, "INSERT": 1}
    assert statements(captured) == Counter({"SELECT": 1, **writes})
    assert not any("MAX(" in q["sql"].upper() for q in captured.captured_queries)
    # The returned run shows what was written, the database clock's columns too: the row as the
    # guarded UPDATE returned it, nothing left to load.
    with CaptureQueriesContext(connection) as shown:
        assert decided.run.status == (Status.RUNNING if identity else Status.QUEUED)
        assert decided.run.claimed_by == (identity or "")
        assert decided.run.lease_epoch == (2 if identity else 1)
        assert decided.run.pending_turn is None
        assert decided.run.loop_state["decision"] == ApprovalDecision(approved=True).to_json()
        assert decided.run.get_deferred_fields() == set()
        assert decided.run.updated_at is not None
        assert (decided.run.lease_expires is not None) == bool(identity)
    assert shown.captured_queries == []
    row = AgentRun.objects.get(pk=lease.run_id)
    assert (decided.run.lease_expires, decided.run.updated_at) == (
        row.lease_expires,
        row.updated_at,
    )
    assert (row.status, row.claimed_by, row.lease_epoch, row.loop_state) == (
        decided.run.status,
        decided.run.claimed_by,
        decided.run.lease_epoch,
        decided.run.loop_state,
    )


def test_the_event_may_be_built_from_the_locked_run():
    lease = start()
    suspend(lease)
    seen = []

    with locked_waiting_run(
        lease.uuid, expected_status=Status.WAITING_FOR_APPROVAL, turn_digest=DIGEST
    ) as run:
        seen.append((run.status, run.pending_turn["turn_digest"]))
        record_decision(
            run,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=DIGEST,
            decision=ApprovalDecision(approved=True),
            event=EventSpec(EventKind.APPROVAL, {"calls": len(run.pending_turn["calls"])}),
            identity=None,
        )

    assert seen == [(Status.WAITING_FOR_APPROVAL, DIGEST)]
    approval = AgentRunEvent.objects.get(run_id=lease.run_id, kind=EventKind.APPROVAL)
    assert approval.payload == {"calls": 1}


def test_an_approval_names_the_pending_calls_and_reads_the_run_only_under_the_lock(probes):
    script = [
        tool_turn(call("probe_write", value="x"), call("probe_read", value="y")),
        {"content": "done"},
    ]
    result = run_start_sync(configuration=config(), prompt="p", options={"script": script})
    assert result.outcome == Outcome.AWAITING_APPROVAL
    pending = result.run.pending_turn
    staff = decider()
    assert staff.has_perm("agentruns.decide_agentrun")  # caches the permissions: not counted

    with CaptureQueriesContext(connection) as captured:
        decided = service_decide(
            run_uuid=result.run.uuid,
            actor=staff,
            approved=True,
            turn_digest=pending["turn_digest"],
            mode="queued",
        )

    assert decided.outcome == Outcome.QUEUED
    # The locked row with its configuration (the approver group, read afresh under the lock:
    # docs/design.md §5.6) in one statement; the next event sequence is on the locked row.
    selects = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]
    # Django quotes names; the named statements do not.
    runs_read = [sql for sql in selects if "FROM agentruns_agentrun " in sql.replace('"', "")]
    assert len(runs_read) == 1
    # And the approver, read afresh under the lock too (its permissions are not the ones
    # cached above): the user, then its own and its groups' permissions (the model backend).
    assert len(selects) == 4, selects
    assert all('"auth_' in sql for sql in selects if sql not in runs_read)
    approval = AgentRunEvent.objects.get(run=result.run, kind=EventKind.APPROVAL)
    assert approval.payload["calls"] == [
        {"id": c["id"], "name": c["name"]} for c in pending["calls"]
    ]
    assert [c["name"] for c in approval.payload["calls"]] == ["probe_write", "probe_read"]
