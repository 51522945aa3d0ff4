"""The segment: one stretch of execution of a run, from its last step boundary to a pause or an
end (docs/design.md §3, §6), told top to bottom by ``continue_segment``.

A segment starts from a claim: its caller took the lease (a start, a worker's claim, a decision
continued inline) and hands it over. The segment resumes where the run's last boundary left it,
then runs steps — the open turn (``turn_step``), or the next provider call (``model_step``)
and the settle of its final answer (sent back once when it fails the configuration's output
schema, ``structured_output``) — until one returns a ``Stop``: a pause, a hand-back, a failure,
the lease lost, or the run settled. ``max_iterations`` rounds end with one final call offered
no tools (§6.2).

Each step takes the segment's state (``SegmentState``) and what it works with — the lease, the
run, the gate and the provider (``Segment``) and the boundary writer (``Boundaries``) — and
returns the state advanced, or how the segment ended. Every write is a boundary of the writer: a
write that matches no row means the lease is lost (or the run was cancelled) and the segment
stops at once (§3.5). Before a write tool runs, its effect is stamped on the row (the fence,
``tool_step``); the boundary after it clears the stamp (§4.4).
"""

from __future__ import annotations

import logging
from functools import cache, partial
from typing import Any

from agentruns import metrics, tracing
from agentruns.conf import app_settings
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.providers import provider_for
from agentruns.services.runtime.boundaries import Boundaries
from agentruns.services.runtime.failures import settle_internal_error
from agentruns.services.runtime.model_step import ask_model
from agentruns.services.runtime.results import (
    EventObserver,
    Outcome,
    RetryScheduler,
    SegmentResult,
    Stop,
    Waker,
)
from agentruns.services.runtime.segment_state import Finished, Segment, SegmentState
from agentruns.services.runtime.structured_output import judge
from agentruns.services.runtime.transcript import NotRehydratable, rehydrate
from agentruns.services.runtime.turn_step import run_turn
from agentruns.services.runtime.verdicts import apply_decision
from agentruns.tools.gate import ToolGate
from agentruns.tools.mcp_sessions import session_scope
from agentruns.versions import pin

logger = logging.getLogger(__name__)


def continue_segment(
    lease: Lease,
    *,
    retry: RetryScheduler | None = None,
    wake: Waker | None = None,
    observer: EventObserver | None = None,
    reload_run: bool = True,
    run: AgentRun | None = None,
    events: list[AgentRunEvent] | None = None,
) -> SegmentResult:
    """Run ``lease``'s run from its last step boundary until it pauses, ends, is handed back
    (``wake``: a worker's segment) or is lost.

    ``run``: the row, with its configuration, as the transition that made ``lease`` wrote it
    (``Decided.run``, ``Claimed.run``), instead of reading it again; ``events``: all of the
    run's events, when that transition knows them (``Claimed.events``). ``retry`` (workers
    only) schedules a delayed wake-up after a retryable failure was requeued; without it
    failures settle the run. ``observer`` sees every event once its boundary committed. The
    result's ``run`` is read again at the end (or is the row a suspend returned), or with
    ``reload_run=False`` (a caller that reads only the outcome) is the row as the segment
    loaded it at its start.

    A segment whose turn standing rules approved (``Stop.continued``) is followed at once by
    the segment continuing under the rules' claim, as an inline decision's is."""
    while True:
        seg, stop = _one_segment(lease, retry, wake, observer, run, events)
        if stop.continued is None or stop.continued.lease is None:
            break
        lease, run, events = stop.continued.lease, stop.continued.run, None
    if not reload_run:
        return SegmentResult(stop.outcome, seg.run, stop.detail)
    return SegmentResult(stop.outcome, stop.run or _reload(lease), stop.detail)


def _one_segment(
    lease: Lease,
    retry: RetryScheduler | None,
    wake: Waker | None,
    observer: EventObserver | None,
    run: AgentRun | None,
    events: list[AgentRunEvent] | None,
) -> tuple[Segment, Stop]:
    """One segment under ``lease``, from its claim to its ``Stop``."""
    seg = _segment(lease, run, retry)
    state = SegmentState()
    # One session per remote server for this segment's calls (§4.5): closed when the segment
    # ends, or as soon as it learns its lease is lost (``Boundaries.lost``).
    with (
        session_scope() as sessions,
        tracing.segment(seg.run, owner=lease.owner, epoch=lease.epoch) as span,
    ):
        writer = Boundaries(seg, observer=observer, wake=wake, sessions=sessions)
        try:
            stop = _run(state, seg, writer, events)
        except StateWriteFailed as exc:
            # The database refused a state write. The lease runs out and the reaper settles
            # or resumes the run from its last boundary; nothing half-written is announced.
            logger.error("run %s: state write failed: %s", lease.uuid, exc)
            stop = Stop.of(Outcome.FAILED, error=exc.code)
        except Exception as exc:
            stop = settle_internal_error(lease, state.loop, exc)
        span.set(leasehold__segment__outcome=str(stop.outcome))
    metrics.record_segment_end(lease=lease, lease_lost=stop.outcome == Outcome.LEASE_LOST)
    return seg, stop


def _run(
    state: SegmentState, seg: Segment, writer: Boundaries, events: list[AgentRunEvent] | None
) -> Stop:
    """Resume where the run's last boundary left it, then one step after another until a step
    ends the segment: a pause, a hand-back, a failure, the lease lost, or the final answer
    settled."""
    step = _resume(state, seg, writer, events)
    while isinstance(step, SegmentState):
        step = _step(step, seg, writer)
    return step


def _resume(
    state: SegmentState, seg: Segment, writer: Boundaries, events: list[AgentRunEvent] | None
) -> SegmentState | Stop:
    """Take the run up where its last boundary left it: the loop state and the dialogue rebuilt
    from its events (a run that cannot be is settled ``not_resumable``), then a decision
    recorded while it waited applied to its turn (``verdicts.apply_decision``)."""
    try:
        rehydrated = rehydrate(seg.run, events)
    except NotRehydratable as exc:
        error = {"type": "NotRehydratable", "message": str(exc)}
        reason = TerminationReason.NOT_RESUMABLE
        stop = writer.settle(state, Status.FAILED, reason, error=error)
        return stop or Stop.of(Outcome.FAILED, reason=reason)
    state.loop, state.messages = rehydrated.loop_state, rehydrated.messages
    if rehydrated.next_sequence > seg.lease.next_sequence:
        # The lease's counter was behind the stored events: so is its head (read it again).
        seg.lease.next_sequence, seg.lease.head = rehydrated.next_sequence, None
    decision_events = apply_decision(state.loop, gate=seg.gate)
    if decision_events and (stop := writer.write(state, decision_events)):
        return stop
    # Otherwise no boundary here: the claim that started this segment just renewed the lease,
    # and the next step's boundary or fence stamp saves the state (with the decision applied)
    # and notices a cancel. Should the segment die before that, only reads can have run, and
    # the next segment re-applies the stored decision (idempotent).
    if state.loop.turn is None and (recorded := _answered(state)) is not None:
        # A final answer recorded before it was settled (a row from before the answer and its
        # settle became one write): settle from it, never ask the model again (unless it fails
        # the output schema: sent back).
        truncated = state.loop.iteration >= seg.rounds
        return _settle_answer(state, seg, writer, Finished(recorded, None, truncated))
    return state


def _step(state: SegmentState, seg: Segment, writer: Boundaries) -> SegmentState | Stop:
    """The next step: hand the run back when the worker is stopping (a safe point, between
    steps), else run the open turn, else ask the model (offered no tools at the round cap) and
    settle its final answer."""
    if writer.stopping():
        return writer.hand_back(state, at="round")
    if state.loop.turn is not None:
        return run_turn(state, seg, writer, state.loop.turn)
    answer = ask_model(state, seg, writer, final=state.loop.iteration >= seg.rounds)
    if isinstance(answer, Finished):
        # The final answer is recorded by the settle itself: one write, no gap.
        return _settle_answer(state, seg, writer, answer)
    return answer


def _settle_answer(
    state: SegmentState, seg: Segment, writer: Boundaries, answer: Finished
) -> SegmentState | Stop:
    """Settle the final answer — unless the configuration's ``output_schema`` refuses it
    (``structured_output.judge``): the first time it is recorded with what failed and the
    model is asked again (the state); the next time the run ends ``failed`` / ``bad_output``."""
    judged = judge(seg.config.output_schema, answer.output, state.loop)
    recorded = [answer.answered] if answer.answered is not None else []
    if judged.repair is not None:
        return writer.write(state, [*recorded, judged.repair]) or state
    if judged.failure is not None:
        reason = TerminationReason.BAD_OUTPUT
        failed = [*recorded, EventSpec(EventKind.ERROR, dict(judged.failure))]
        stop = writer.settle(state, Status.FAILED, reason, error=judged.failure, events=failed)
        return stop or Stop.of(Outcome.FAILED, reason=reason)
    return writer.settle_completed(state, answer, output_object=judged.value)


# -- what a segment reads --


def _segment(lease: Lease, run: AgentRun | None, retry: RetryScheduler | None) -> Segment:
    """What the segment works with: the run as the claim returned it (else read now) and its
    configuration as the run pinned it (``versions.pin``: the version the run started with,
    cached in-process; the live row only for what is not versioned)."""
    if run is None:
        run = AgentRun.objects.select_related("configuration").get(pk=lease.run_id)
    config = pin(run).configuration
    request = run.request if isinstance(run.request, dict) else {}
    return Segment(
        lease=lease,
        run=run,
        config=config,
        request=request,
        gate=ToolGate.for_run(config, request),
        # Built for the segment's first provider call, once.
        provider=cache(partial(provider_for, config, request)),
        rounds=_round_cap(config, request),
        retry=retry,
    )


def _reload(lease: Lease) -> AgentRun:
    return AgentRun.objects.select_related("configuration", "initiator").get(pk=lease.run_id)


def _answered(state: SegmentState) -> str | None:
    """The content of the dialogue's final answer, when it ends with one."""
    last = state.messages[-1] if state.messages else {}
    if last.get("role") == "assistant" and not last.get("tool_calls"):
        return str(last.get("content") or "")
    return None


def _round_cap(config: AgentConfiguration, request: dict[str, Any]) -> int:
    """The rounds this run may take: the request's ``max_iterations``, else the
    configuration's, within 1…``MAX_ITERATIONS``."""
    limit = app_settings().max_iterations
    requested = request.get("max_iterations")
    cap = requested if isinstance(requested, int) and requested > 0 else config.max_iterations
    return max(1, min(int(cap), limit))
