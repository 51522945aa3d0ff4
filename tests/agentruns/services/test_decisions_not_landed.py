"""After *It did not land* the write does not run again without a new approval (docs/design.md
§9, §13): the verdict marks the in-doubt call done with a result saying it did not take effect,
and when the model proposes the very same call again it is a new call (new id, new digest) that
waits for its own approval. Nothing runs until then, and no earlier decision can approve it.

Real runs through the services: the scripted model proposes the same non-idempotent write twice;
the first execution ends in doubt — the tool could not tell whether it landed, or the segment
died while it ran and the reaper parked the run — and the probe counts executions.

The slip it catches: a ``not_landed`` verdict that leaves the in-doubt call open ("it did not
happen, so do it"): the turn's approval was saved with the fence stamp, so the continuing segment
runs the write again at once, on an approval given before anyone knew the first attempt's fate.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from agentruns.exceptions import AlreadyDecided
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import reaper, runs
from agentruns.services.runtime.results import Outcome, SegmentResult
from agentruns.turns import read_pending_turn
from tests.agentruns.support.api import card_digest
from tests.agentruns.support.runtime import (
    call,
    config,
    decide_inline,
    decider,
    events,
    outcome_unknown_once,
    tool_turn,
)

pytestmark = pytest.mark.django_db

WRITE = call("probe_create", value="x")


class ProcessDied(BaseException):
    """Stands for the process vanishing mid-write: nothing in the runtime catches it."""


def die_once():
    """A ``Probe.during`` hook: the first execution dies after recording itself."""
    died: list[str] = []

    def during(entry: dict[str, Any]) -> None:
        if not died:
            died.append(entry["call_id"])
            raise ProcessDied()

    return during


def left_in_doubt(probes: Any, origin: str) -> AgentRun:
    """A run whose approved ``WRITE`` ran once and may or may not have landed."""
    configuration = config(script=[tool_turn(WRITE), tool_turn(WRITE), {"content": "done"}])
    run = runs.run_start_sync(configuration=configuration, prompt="write x").run
    if origin == "outcome-unknown":
        probes.during = outcome_unknown_once()
        assert decide_inline(run).outcome == Outcome.AWAITING_RECONCILIATION
    else:
        probes.during = die_once()
        with pytest.raises(ProcessDied):
            decide_inline(run)
        AgentRun.objects.filter(pk=run.pk).update(lease_expires=Now() - timedelta(seconds=1))
        [verdict] = reaper.reap_stale_runs().verdicts
        assert verdict.verdict == reaper.Verdict.IN_DOUBT
    probes.during = None
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert len(probes.seen) == 1
    return run


def continued(result: SegmentResult, mode: str) -> SegmentResult:
    if mode == "queued":
        assert result.outcome == Outcome.QUEUED
        worker = runs.run_process_queued(run_uuid=result.run.uuid)
        assert worker is not None
        return worker
    return result


@pytest.mark.parametrize("mode", ["inline", "queued"])
@pytest.mark.parametrize("origin", ["outcome-unknown", "segment-died"])
def test_a_write_that_did_not_land_runs_again_only_after_a_new_approval(probes, origin, mode):
    run = left_in_doubt(probes, origin)
    first_call_id = probes.seen[0]["call_id"]
    approval_digest = next(
        e.payload["turn_digest"] for e in events(run) if e.kind == EventKind.APPROVAL
    )
    verdict_digest = card_digest(run)

    result = continued(
        runs.run_reconcile(
            run_uuid=run.uuid,
            actor=decider(),
            verdict="not_landed",
            turn_digest=verdict_digest,
            mode=mode,
        ),
        mode,
    )

    # The model was told it did not land, proposed it again, and that waits for a person.
    assert result.outcome == Outcome.AWAITING_APPROVAL, result
    assert len(probes.seen) == 1, "the write ran again without a new approval"
    [reconciled] = [e for e in events(run) if e.kind == EventKind.TOOL]
    assert (reconciled.payload["call_id"], reconciled.payload["outcome"]) == (
        first_call_id,
        "reconciled_not_landed",
    )
    run = AgentRun.objects.get(pk=run.pk)
    card = read_pending_turn(run)
    [again] = card.calls
    assert (again.name, again.arguments) == ("probe_create", {"value": "x"})
    assert again.id != first_call_id
    assert card.turn_digest not in (approval_digest, verdict_digest)
    # No earlier decision approves it: neither the first approval nor the verdict, sent again.
    with pytest.raises(AlreadyDecided):
        runs.run_decide(
            run_uuid=run.uuid, actor=decider(), approved=True, turn_digest=approval_digest
        )
    with pytest.raises(AlreadyDecided):
        runs.run_reconcile(
            run_uuid=run.uuid, actor=decider(), verdict="not_landed", turn_digest=verdict_digest
        )
    assert len(probes.seen) == 1

    done = decide_inline(run)

    assert done.outcome == Outcome.COMPLETED
    assert [(s["tool"], s["call_id"]) for s in probes.seen] == [
        ("probe_create", first_call_id),
        ("probe_create", again.id),
    ]
