"""The OpenAI Agents SDK's runner under a Leasehold run's lease: start, pause, resume
(docs/external.md).

``start`` opens a run and drives ``Runner.run`` while holding its lease; ``resume`` claims a queued
run (decided in the inbox, reconciled, or reclaimed by the reaper after its process died) and
continues it from the ``RunState`` stored with it. Between them the run waits in the inbox: the
SDK's interruptions are the calls of the run's pending turn, the serialised ``RunState`` is the
run's ``external_state`` (bounded: ``StateTooLarge``), and the inbox's verdicts become
``state.approve`` / ``state.reject`` — a denial's message, with the reviewer's reason under its
own key, is the tool output the model reads (data, never instructions).

Threads: these functions are synchronous. The lease, its ticker and every statement of the
holding belong to the calling thread; the SDK runs on an event loop in another thread
(``async_to_sync``) and calls back into this one (``_tools``). They must not be called from a
thread running an event loop (wrap them in ``sync_to_async`` there).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from agents import Agent, RunConfig, Runner, RunState
from agents.items import ModelResponse
from agents.lifecycle import RunHooks
from asgiref.sync import async_to_sync, sync_to_async
from openai.types.responses import ResponseFunctionToolCall

from agentruns import external
from agentruns.exceptions import LeaseholdError
from agentruns.external import (
    Card,
    Holding,
    LeaseLost,
    NotHoldable,
    RunPaused,
    StateNotStorable,
    StateTooLarge,
)
from agentruns.external.holding import ENDED, LOST, PAUSED
from agentruns.external.openai_agents import _tools
from agentruns.external.values import APPROVED, DENIED, UNDECIDED
from agentruns.services._common import User

logger = logging.getLogger(__name__)

FRAMEWORK = "openai-agents"

COMPLETED = "completed"
WAITING = "waiting"
LEASE_LOST = "lease_lost"
FAILED = "failed"


class StoredStateUnreadable(LeaseholdError):
    """The Agents SDK state stored with the run cannot be read back for this agent."""

    code = "external_state_unreadable"
    status = 409


@dataclass(frozen=True)
class Result:
    """Where a run stands when ``start`` or ``resume`` returns: ``completed`` (``output``: the
    final answer), ``waiting`` (``card``: what a person decides on in the inbox), ``lease_lost``
    (another process holds the run now: this one wrote nothing more) or ``failed``."""

    run_uuid: str
    outcome: str
    output: str = ""
    card: Card | None = None


@dataclass
class _Paused:
    state: RunState[Any, Any]


def _unguarded(agent: Agent[Any]) -> list[str]:
    names = [getattr(t, "name", type(t).__name__) for t in agent.tools if not _tools.is_guarded(t)]
    if agent.handoffs:
        names.append("handoffs")
    return names


def _checked(agent: Agent[Any]) -> Agent[Any]:
    """Fail closed: every tool of the agent is guarded, and it hands off to nobody."""
    if unguarded := _unguarded(agent):
        raise TypeError(
            "every tool must be made with agentruns.external.openai_agents.leasehold_tool: "
            f"not {', '.join(unguarded)}"
        )
    return agent


class _Proposals(RunHooks[Any]):
    """Records each model answer's calls as the run's turn as soon as the model answers, so a
    turn with a write waits for the inbox as a whole, reads included (docs/design.md §5.1)."""

    def __init__(self, holding: Holding) -> None:
        self.holding = holding

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        calls = [
            _tools.proposed(item.call_id, item.name, item.arguments)
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall)
        ]
        if calls:
            await sync_to_async(self.holding.propose, thread_sensitive=True)(calls)


def _settle(holding: Holding, state: RunState[Any, Any]) -> bool:
    """Give each interruption of ``state`` the run's verdict: approved (or recorded: its
    recorded outcome is returned when the SDK invokes it) → ``approve``; denied → ``reject``
    with the message the model reads. ``True`` when one is undecided: the run must wait."""
    waiting = False
    for item in state.get_interruptions():
        raw = item.raw_item
        call = _tools.proposed(
            getattr(raw, "call_id", ""), item.tool_name or "", getattr(raw, "arguments", "")
        )
        verdict = holding.verdict(call)
        if verdict.state == UNDECIDED:
            waiting = True
        elif verdict.state == DENIED and verdict.outcome is not None:
            state.reject(item, rejection_message=verdict.outcome.message)
        elif verdict.state == APPROVED or verdict.outcome is not None:
            state.approve(item)
    return waiting


async def _waits(holding: Holding, state: RunState[Any, Any]) -> bool:
    if not state.get_interruptions():
        return False
    return bool(await sync_to_async(_settle, thread_sensitive=True)(holding, state))


async def _drive(
    holding: Holding, agent: Agent[Any], start: str | RunState[Any, Any], config: RunConfig | None
) -> _Paused | str:
    """Run the SDK until it answers (its final output) or waits for a person (its state)."""
    token = _tools.current_holding.set(holding)
    try:
        hooks = _Proposals(holding)
        current: str | RunState[Any, Any] = start
        while True:
            if isinstance(current, RunState) and await _waits(holding, current):
                return _Paused(current)
            result = await Runner.run(agent, current, hooks=hooks, run_config=config)
            if not result.interruptions:
                return str(result.final_output if result.final_output is not None else "")
            current = result.to_state()
    finally:
        _tools.current_holding.reset(token)


def _stored(agent: Agent[Any], state: RunState[Any, Any] | None) -> dict[str, Any]:
    return {"agent": agent.name, "run_state": state.to_json() if state is not None else None}


def _drive_holding(
    holding: Holding, agent: Agent[Any], start: str | RunState[Any, Any], config: RunConfig | None
) -> Result:
    """Drive the SDK under ``holding`` and settle what it came to: completed, waiting (the state
    stored, the run suspended for the inbox), lost or failed. An exception that is not an
    ``Exception`` (the process going away) leaves the holding untouched."""
    try:
        ended = async_to_sync(_drive)(holding, agent, start, config)
    except Exception as exc:  # the SDK wraps what a tool raised (UserError "Error running tool")
        return _after_exception(holding, exc)
    try:
        if isinstance(ended, _Paused):
            card = holding.suspend(state=_stored(agent, ended.state))
            return Result(holding.run_uuid, WAITING, card=card)
        holding.complete(ended)
    except LeaseLost:
        return Result(holding.run_uuid, LEASE_LOST)
    except (StateTooLarge, StateNotStorable) as refused:
        holding.fail(str(refused))  # resuming would come back to the same state: end it
        raise
    return Result(holding.run_uuid, COMPLETED, output=ended)


def _after_exception(holding: Holding, exc: Exception) -> Result:
    if holding.phase == PAUSED:  # a write went in doubt, or the turn came to wait
        return Result(holding.run_uuid, WAITING, card=holding.card)
    if holding.phase in (LOST, ENDED) or _caused_by(exc, LeaseLost):
        logger.warning("run %s: lease lost: %s", holding.run_uuid, exc)
        return Result(holding.run_uuid, LEASE_LOST)
    logger.exception("run %s: the Agents SDK failed", holding.run_uuid)
    holding.fail(f"{type(exc).__name__}: {exc}")
    return Result(holding.run_uuid, FAILED)


def _caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, kind):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def start(
    agent: Agent[Any],
    *,
    configuration: Any,
    prompt: str,
    initiator: User | None = None,
    run_config: RunConfig | None = None,
) -> Result:
    """Start a Leasehold run for ``agent`` (every tool ``leasehold_tool``-ed) on ``prompt`` under
    ``configuration`` (its approver group, four-eyes, deadlines, notifications; its provider is
    never called) and drive it while holding its lease, until it completes or waits in the
    inbox. ``initiator``: who asked (four-eyes: they may deny, not approve)."""
    _checked(agent)
    with external.open_run(
        configuration=configuration,
        prompt=prompt,
        framework=FRAMEWORK,
        initiator=initiator,
        state=_stored(agent, None),
    ) as holding:
        return _drive_holding(holding, agent, prompt, run_config)


def _start_of(holding: Holding, agent: Agent[Any]) -> str | RunState[Any, Any]:
    """Where the SDK continues: the stored ``RunState``, or the prompt again when the run never
    paused (its recorded calls return their outcomes)."""
    stored = holding.state
    if not isinstance(stored, dict) or stored.get("agent") != agent.name:
        raise StoredStateUnreadable(f"the run was not started by an agent named {agent.name!r}")
    if stored.get("run_state") is None:
        return str(holding.run.prompt)
    try:
        return async_to_sync(RunState.from_json)(agent, stored["run_state"])
    except Exception as exc:
        raise StoredStateUnreadable(f"the stored RunState cannot be read: {exc}") from None


def resume(
    agent: Agent[Any], run_uuid: UUID | str, *, run_config: RunConfig | None = None
) -> Result:
    """Claim the queued run ``run_uuid`` (decided in the inbox, reconciled, or reclaimed after
    its process died) and continue ``agent`` from the state stored with it: the inbox's
    verdicts applied to the SDK's interruptions, a call recorded before returning its recorded
    outcome (a write that may have landed is never run again). ``NotHoldable``: it is not
    queued for this framework. A stored state this agent cannot read fails the run."""
    _checked(agent)
    with external.hold(run_uuid, framework=FRAMEWORK) as holding:
        try:
            start = _start_of(holding, agent)
        except StoredStateUnreadable as exc:
            holding.fail(str(exc))
            return Result(holding.run_uuid, FAILED)
        return _drive_holding(holding, agent, start, run_config)


def resume_all(
    agents: Agent[Any] | Iterable[Agent[Any]],
    *,
    limit: int = 100,
    run_config: RunConfig | None = None,
) -> list[Result]:
    """One worker pass: resume every queued run of this framework whose stored agent is one of
    ``agents`` (by name), oldest first. A run another worker claimed first is skipped."""
    listed = [agents] if isinstance(agents, Agent) else list(agents)
    by_name = {agent.name: agent for agent in listed}
    results = []
    for run_uuid in external.resumable(framework=FRAMEWORK, limit=limit):
        stored = external.stored_state(run_uuid)
        name = stored.get("agent") if isinstance(stored, dict) else None
        agent = by_name.get(name) if isinstance(name, str) else None
        if agent is None:
            continue
        try:
            results.append(resume(agent, run_uuid, run_config=run_config))
        except (NotHoldable, RunPaused):
            continue
    return results
