"""A decision binds exactly the turn it was given for (docs/design.md §5.3, §5.5): the digest it
carries must equal the pending turn's, whole, and the digest covers each call's id, so the very
same call proposed again in a later turn is a new turn with a new digest.

Real runs through the services: the scripted model proposes the same non-idempotent write (same
tool, same arguments) in two turns; the probe counts its executions.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentruns.exceptions import AlreadyDecided, StaleTurn
from agentruns.models import AgentRun, Status
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome
from agentruns.turns import read_pending_turn
from tests.agentruns.support.runtime import (
    call,
    config,
    decide_inline,
    decider,
    snapshot,
    tool_turn,
)

pytestmark = pytest.mark.django_db

WRITE = call("probe_create", value="x")


def waiting_on_the_same_call_again(probes: Any) -> tuple[AgentRun, str]:
    """A run that proposed ``WRITE``, had it approved and run, and proposed it again: it waits
    for approval of the second turn. Returns the run and the first turn's digest."""
    configuration = config(script=[tool_turn(WRITE), tool_turn(WRITE), {"content": "done"}])
    first = runs.run_start_sync(configuration=configuration, prompt="write x")
    assert first.outcome == Outcome.AWAITING_APPROVAL
    first_digest = read_pending_turn(first.run).turn_digest
    second = decide_inline(first.run)
    assert second.outcome == Outcome.AWAITING_APPROVAL
    assert len(probes.seen) == 1
    return AgentRun.objects.get(pk=first.run.pk), first_digest


@pytest.mark.parametrize("mode", ["inline", "queued"])
def test_the_digest_of_an_earlier_turn_proposing_the_same_call_is_already_decided(probes, mode):
    """The slip it catches: a digest of names and arguments only (the call id left out). The two
    turns then share a digest, and a decision sent for the first — a second click on the old
    card, a retried request — approves the second, which nobody saw, and the write runs again."""
    run, first_digest = waiting_on_the_same_call_again(probes)
    pending = read_pending_turn(run)
    (again,) = pending.calls
    assert (again.name, again.arguments) == ("probe_create", {"value": "x"})
    assert again.id != probes.seen[0]["call_id"]
    before = snapshot(run)

    with pytest.raises(AlreadyDecided):
        runs.run_decide(
            run_uuid=run.uuid,
            actor=decider(),
            approved=True,
            turn_digest=first_digest,
            mode=mode,
        )

    assert snapshot(run) == before
    assert len(probes.seen) == 1
    assert pending.turn_digest != first_digest
    # The turn that waits is decided with its own digest, and only then does the write run again.
    assert decide_inline(run).outcome == Outcome.COMPLETED
    assert [entry["arguments"] for entry in probes.seen] == [{"value": "x"}] * 2


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda d: d[:-1], id="all-but-the-last-character"),
        pytest.param(lambda d: d[:12], id="twelve-characters"),
        pytest.param(lambda d: d[:1], id="one-character"),
        pytest.param(lambda d: d + "0", id="extended"),
        pytest.param(lambda d: d.upper(), id="upper-case"),
    ],
)
@pytest.mark.parametrize("mode", ["inline", "queued"])
def test_a_decision_carrying_part_of_the_digest_is_stale(probes, tamper, mode):
    """The slip it catches: a comparison looser than equality (``startswith`` either way, so a
    short form shown on a card would do; case folded). The digest sent must be the pending turn's,
    whole."""
    configuration = config(script=[tool_turn(WRITE), {"content": "done"}])
    run = runs.run_start_sync(configuration=configuration, prompt="write x").run
    digest = read_pending_turn(run).turn_digest
    before = snapshot(run)

    with pytest.raises(StaleTurn):
        runs.run_decide(
            run_uuid=run.uuid, actor=decider(), approved=True, turn_digest=tamper(digest), mode=mode
        )

    assert snapshot(run) == before
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    assert probes.seen == []
