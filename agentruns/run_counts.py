"""What a run's model calls came to so far — rounds and tokens — for every status: the one
reading every interface shows (the playground, the API, the admin, the timeline).

The loop state (``AgentRun.loop_state``, ``agentruns.turns.LoopState``) is saved at every step
boundary with the rounds made and the tokens reported so far, in the same write as the events
that record them; a settle copies it into the run's columns. A run that ends otherwise
(cancelled, abandoned, failed by the reaper) or that waits has columns that still read 0, so the
loop state is read; a loop state that cannot be read falls back to the columns. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from agentruns.models import AgentRun
from agentruns.turns import LoopState, Unreadable


@dataclass(frozen=True)
class RunCounts:
    """Rounds (provider calls made, the final one included) and tokens reported so far, and
    the run's cost so far (its ``cost`` column, written with each answer)."""

    rounds: int
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def run_counts(run: AgentRun) -> RunCounts:
    """``run``'s counts as its last step boundary recorded them (see the module docstring)."""
    try:
        state = LoopState.parse(run.loop_state)
    except Unreadable:
        return RunCounts(run.iterations, run.prompt_tokens, run.completion_tokens, run.cost)
    return RunCounts(
        rounds=max(state.iteration, run.iterations),
        prompt_tokens=max(state.usage.prompt_tokens, run.prompt_tokens),
        completion_tokens=max(state.usage.completion_tokens, run.completion_tokens),
        cost=run.cost,
    )
