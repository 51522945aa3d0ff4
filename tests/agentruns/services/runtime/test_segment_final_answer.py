"""The model's final answer and the run's completion are one write (issue 11 §1): a segment
that dies after the answer arrived either recorded it *and* settled, or recorded nothing and the
continuing segment asks again — never a recorded answer that nobody settles."""

from __future__ import annotations

import pytest

from agentruns import transitions
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.services.runtime.segment import continue_segment
from agentruns.transitions import run_heartbeat
from tests.agentruns.factories import AgentRunFactory, lease_for
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.leases import reclaim_and_claim
from tests.agentruns.support.runtime import assert_contiguous, config, events

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("truncated", [False, True], ids=["answer", "max-iterations"])
def test_a_segment_dying_as_it_settles_records_no_half_answer(monkeypatch, truncated):
    script = [{"content": "all done"}]
    if truncated:
        script = [{"tool_calls": [{"name": "list_notes", "arguments": {}}]}, {"content": "cut"}]
    configuration = config(max_iterations=1) if truncated else config()
    settle = transitions.run_settle
    died: list[bool] = []

    def dies_once(**kwargs):
        if not died:
            died.append(True)
            raise ProcessDied()
        return settle(**kwargs)

    monkeypatch.setattr(transitions, "run_settle", dies_once)
    with pytest.raises(ProcessDied):
        runs.run_start_sync(configuration=configuration, prompt="p", options={"script": script})
    run = AgentRun.objects.get()
    assert run.status == Status.RUNNING
    assert [e.payload.get("final") for e in events(run) if e.kind == EventKind.LLM] == (
        [False] if truncated else []
    )  # the final answer went with the write that never happened

    result = continue_segment(reclaim_and_claim(run))

    assert result.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert run.output == ("cut" if truncated else "all done")
    assert run.termination_reason == (
        TerminationReason.MAX_ITERATIONS if truncated else TerminationReason.COMPLETED
    )
    finals = [e for e in events(run) if e.kind == EventKind.LLM and not e.payload["tool_calls"]]
    assert len(finals) == 1
    assert_contiguous(run)


def test_a_recorded_final_answer_is_settled_without_asking_the_model_again():
    """A row left by the earlier two-write boundary: the answer recorded, the settle lost. The
    continuing segment settles from the record; the exhausted script proves no provider call."""
    run = AgentRunFactory(
        running=True,
        configuration=config(script=[{"content": "only once"}]),
        loop_state={"iteration": 1, "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    lease = lease_for(run)
    assert run_heartbeat(
        lease,
        events=[
            EventSpec(EventKind.REQUEST, {"iteration": 0, "final": False, "messages": []}),
            EventSpec(
                EventKind.LLM,
                {"iteration": 1, "final": False, "content": "only once", "tool_calls": []},
            ),
        ],
    )

    result = continue_segment(reclaim_and_claim(run))

    assert result.outcome == Outcome.COMPLETED
    run.refresh_from_db()
    assert (run.status, run.output, run.total_tokens) == (Status.COMPLETED, "only once", 5)
    assert [e.kind for e in events(run)].count(EventKind.REQUEST) == 1
