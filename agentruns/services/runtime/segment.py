"""The segment: one stretch of execution of a run, from its last step boundary to a pause or an
end (docs/design.md §3, §6).

A segment holds a ``Lease``. Every step boundary is one owner-guarded write that renews the
lease, saves the loop state and appends the step's events; a write that matches no row means
the lease is lost (or the run was cancelled) and the segment stops at once: no settle, no event,
no further provider or tool call (§3.5). Before a write tool runs, the fence hook stamps its
effect on the row; the boundary after it clears the stamp (§4.4).

The loop, per round: the approval scan before any call of a turn executes (§5.1); then the calls
in order, each a boundary; then the next provider call. ``max_iterations`` rounds end with one
final call offered no tools (§6.2). Every step returns ``None`` to go on or a ``Stop`` saying how
the segment ended; the loop returns the first ``Stop``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, transaction

from agentruns import budgets, metrics, transitions
from agentruns.conf import app_settings
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    WRITE_EFFECTS,
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.failures import (
    settle_internal_error,
)
from agentruns.services.runtime.provider_step import ProviderStep
from agentruns.services.runtime.results import (
    EventObserver,
    Outcome,
    RetryScheduler,
    SegmentResult,
    Stop,
    Waker,
)
from agentruns.services.runtime.tool_step import (
    denied_event,
    edited_marks,
    execute_tool_call,
    refused_event,
)
from agentruns.services.runtime.transcript import (
    NotRehydratable,
    message_for_event,
    rehydrate,
)
from agentruns.services.runtime.verdicts import apply_decision
from agentruns.tools import Tool
from agentruns.tools.gate import ToolGate
from agentruns.tools.invocation import argument_errors, overlay_input
from agentruns.tools.mcp_sessions import SessionScope, session_scope
from agentruns.turns import (
    Call,
    LoopState,
    Turn,
)

logger = logging.getLogger(__name__)


class RunSegment(ProviderStep):
    """One stretch of execution of a run under ``lease``: the loop and its boundaries here, the
    provider step (``ProviderStep``) and the pauses and endings (``Pauses``, its base) in their
    own modules.

    ``retry`` (workers only) schedules a delayed wake-up after a retryable failure was requeued;
    without it failures settle the run. ``wake`` (workers only) sends the wake-up of a run
    handed back because the worker is stopping (``shutdown``); without it a segment never hands
    back. ``observer`` sees every event once its boundary committed.
    """

    def __init__(
        self,
        lease: Lease,
        *,
        retry: RetryScheduler | None = None,
        wake: Waker | None = None,
        observer: EventObserver | None = None,
        run: AgentRun | None = None,
        events: list[AgentRunEvent] | None = None,
    ) -> None:
        self.lease = lease
        # ``events``: the run's every event when the caller knows them (a first claim's own);
        # otherwise ``_start`` reads them.
        self._replay = events
        self.retry = retry
        self.wake = wake
        self.observer = observer
        # ``run``: the row as a decision just locked and wrote it, with its configuration (read
        # with it); otherwise read here.
        self.run: AgentRun = (
            run
            if run is not None
            else AgentRun.objects.select_related("configuration").get(pk=lease.run_id)
        )
        # Identity over snapshot: the configuration is re-read on every segment.
        self.config: AgentConfiguration = self.run.configuration
        self.request: dict[str, Any] = (
            self.run.request if isinstance(self.run.request, dict) else {}
        )
        self.gate = ToolGate.for_run(self.config, self.request)
        self.state = LoopState()
        self.messages: list[dict[str, Any]] = []
        # The completed last call of a turn, recorded by the boundary that always follows it at
        # once (the request before the next provider call): one write instead of two.
        self._deferred: list[EventSpec] = []
        self._deferred_clear = False
        # The effect of the last write the segment stamped a fence for (its clear's boundary
        # commits itself when it is non-idempotent: ``run_clear_fence``).
        self._fenced_effect = ""
        # One session per remote server for this segment's calls (§4.5): closed when the
        # segment ends (``execute``) or learns its lease is lost (``_lost``).
        self.sessions: SessionScope | None = None
        # The row a suspend left, returned by its UPDATE: the segment's result without a read.
        self._parked: AgentRun | None = None
        # Per call id, the tool and the very arguments ``_answer_invalid_arguments`` accepted
        # for it: ``_execute`` does not check them again when it runs that call with them.
        self._accepted: dict[str, tuple[Tool, Any]] = {}

    # -- entry point --

    def execute(self, *, reload_run: bool = True) -> SegmentResult:
        """Run to the segment's end. The result's ``run`` is read again at the end, or with
        ``reload_run=False`` (a caller that reads only the outcome) is the row as the segment
        loaded it at its start."""
        with session_scope() as self.sessions:
            try:
                stop = self._start()
            except StateWriteFailed as exc:
                # The database refused a state write. The lease runs out and the reaper settles
                # or resumes the run from its last boundary; nothing half-written is announced.
                logger.error("run %s: state write failed: %s", self.lease.uuid, exc)
                stop = Stop.of(Outcome.FAILED, error=exc.code)
            except Exception as exc:
                stop = settle_internal_error(self.lease, self.state, exc)
        metrics.record_segment_end(lease=self.lease, lease_lost=stop.outcome == Outcome.LEASE_LOST)
        if not reload_run:
            return SegmentResult(stop.outcome, self.run, stop.detail)
        return SegmentResult(stop.outcome, self._parked or self._reload(), stop.detail)

    def _reload(self) -> AgentRun:
        return AgentRun.objects.select_related("configuration", "initiator").get(
            pk=self.lease.run_id
        )

    def _start(self) -> Stop:
        try:
            rehydrated = rehydrate(self.run, self._replay)
        except NotRehydratable as exc:
            error = {"type": "NotRehydratable", "message": str(exc)}
            stop = self._settle(Status.FAILED, TerminationReason.NOT_RESUMABLE, error=error)
            return stop or Stop.of(Outcome.FAILED, reason=TerminationReason.NOT_RESUMABLE)
        self.state = rehydrated.loop_state
        self.messages = rehydrated.messages
        if rehydrated.next_sequence > self.lease.next_sequence:
            # The lease's counter was behind the stored events: so is its head (read it again).
            self.lease.next_sequence, self.lease.head = rehydrated.next_sequence, None
        return self._loop()

    # -- boundaries --

    def _boundary(self, events: list[EventSpec], *, clear_fence: bool = False) -> Stop | None:
        deferred, self._deferred = self._deferred, []
        clear_fence = clear_fence or self._deferred_clear
        self._deferred_clear = False
        written = [*deferred, *events]
        cost = self.state.usage.cost if self._charge is not None else None
        loop_state = self.state.to_json()
        if clear_fence:
            in_doubt = self._fenced_effect == Effect.NON_IDEMPOTENT_WRITE

            def write() -> bool:
                return transitions.run_clear_fence(
                    self.lease,
                    loop_state=loop_state,
                    events=written,
                    cost=cost,
                    in_doubt_unless_committed=in_doubt,
                )

        else:

            def write() -> bool:
                return transitions.run_heartbeat(
                    self.lease, loop_state=loop_state, events=written, cost=cost
                )

        if not self._charged(write):
            return self._lost(completed=written)
        for spec in events:  # the deferred ones joined the dialogue when they were deferred
            self._remember(spec)
        if self.observer is not None:
            for spec in written:
                self.observer(spec)
        return None

    def _charged(self, write: Callable[[], bool]) -> bool:
        """``write`` (which records an answer's event), and the answer's charge in the spend
        ledger (``budgets.charge``) in the same transaction when one is pending: both or
        neither. ``False``: ``write`` matched no row; the charge stays pending for ``_lost``."""
        pending = self._charge
        if pending is None:
            return write()
        with transaction.atomic():
            if not write():
                return False
            try:
                budgets.charge(pending)
            except DatabaseError as exc:  # rolls the write back with it
                raise StateWriteFailed("the spend ledger refused the charge") from exc
        self._charge = None
        return True

    def _step_done(
        self, events: list[EventSpec], *, clear_fence: bool, last_of_turn: bool
    ) -> Stop | None:
        """Record a completed tool step: at once, or, for the last call of a turn, with the next
        boundary. Nothing with a side effect happens in between (the loop goes straight to the
        ``request`` boundary), so a crash there loses exactly what a crash inside the call
        would: the call is executed again (or, fenced non-idempotent, reconciled)."""
        if not last_of_turn:
            return self._boundary(events, clear_fence=clear_fence)
        self._deferred.extend(events)
        self._deferred_clear = self._deferred_clear or clear_fence
        for spec in events:
            self._remember(spec)
        return None

    def _defer(self, spec: EventSpec) -> None:
        """Record ``spec`` with the next write (it joins the dialogue now)."""
        self._deferred.append(spec)
        self._remember(spec)

    def _waits_for_approval(self) -> bool:
        """The current turn goes to a decision before anything of it runs (``_run_turn``)."""
        turn = self.state.turn
        return (
            turn is not None
            and turn.approved is None
            and any(self.gate.needs_approval(c.name) for c in turn.open_calls())
        )

    def _flush(self) -> Stop | None:
        """Write deferred steps before a write that does not carry them (suspend, settle)."""
        return self._boundary([]) if self._deferred else None

    def _remember(self, spec: EventSpec) -> None:
        message = message_for_event(spec.kind, spec.payload)
        if message is not None:
            self.messages.append(message)

    def _lost(self, *, completed: list[EventSpec] | None = None, **detail: Any) -> Stop:
        """A guarded write matched nothing: the run was cancelled under us, or the lease lost.

        Every path that learns of a lost lease (a boundary, the ticker, the fence stamp) comes
        here, so a cancel is always recognised and recorded as one. On a cancel the steps that
        completed (a tool call that ran, a model answer) are recorded before the cancel event,
        so a write that happened is never missing from the audit; a lost lease records nothing.
        The segment's remote sessions are closed first: nothing more is sent under this lease.
        """
        if self.sessions is not None:
            self.sessions.close()
        finished = [
            spec
            for spec in [*self._deferred, *(completed or [])]
            if spec.kind in (EventKind.TOOL, EventKind.LLM, EventKind.IN_DOUBT)
        ]
        self._deferred = []
        cost = self.state.usage.cost if self._charge is not None else None
        noticed = self._charged(
            lambda: transitions.run_notice_cancel(
                self.lease,
                events=[
                    *finished,
                    EventSpec(EventKind.CANCEL, {"note": "noticed at step boundary"}),
                ],
                cost=cost,
            )
        )
        if not noticed and self._charge is not None:
            # The answer was received (and paid for) by a segment that lost its lease: the
            # ledger still counts it; the run's events and cost do not (a zombie writes none).
            pending, self._charge = self._charge, None
            try:
                budgets.charge(pending)
            except DatabaseError:
                logger.exception("run %s: could not charge a lost answer", self.lease.uuid)
        return Stop(Outcome.CANCELLED if noticed else Outcome.LEASE_LOST, dict(detail))

    # -- handing back (a stopping worker, docs/design.md §10.2) --

    def _stopping(self) -> bool:
        """The worker was told to stop, and this segment can hand its run back."""
        return self.wake is not None and shutdown.requested()

    def _hand_back(self, *, at: str) -> Stop:
        """Hand the run back to the queue at a safe point — between steps, never while a write
        is in flight — with the steps not written yet (a deferred last call, its fence's clear)
        and a ``lease`` event ``handed_back``, and its fresh wake-up: one transaction
        (``wake``: with the ORM broker the task row is part of it; another broker sends after
        the commit). The lease is released at once: nobody waits for it to expire, and the
        retry budget is untouched. Should the process die before the commit, nothing of it
        happened: the lease runs out and the reaper decides as for any dead segment (a write
        whose clear was deferred is then in doubt)."""
        deferred, self._deferred = self._deferred, []
        self._deferred_clear = False
        written = [*deferred, EventSpec(EventKind.LEASE, {"action": "handed_back", "at": at})]
        cost = self.state.usage.cost if self._charge is not None else None
        loop_state = self.state.to_json()
        wake = self.wake
        assert wake is not None  # ``_stopping`` is checked first

        def write() -> bool:
            with transaction.atomic():
                if not transitions.run_hand_back(
                    self.lease, loop_state=loop_state, events=written, cost=cost
                ):
                    return False
                try:
                    wake(str(self.lease.uuid))
                except DatabaseError as exc:  # the task row: rolls the hand-back back with it
                    raise StateWriteFailed("the wake-up of a handed-back run failed") from exc
            return True

        if not self._charged(write):
            return self._lost(completed=deferred)
        if self.observer is not None:
            for spec in written:
                self.observer(spec)
        return Stop.of(Outcome.HANDED_BACK, at=at)

    # -- the loop --

    def _loop(self) -> Stop:
        decision_events = apply_decision(self.state, gate=self.gate)
        if decision_events and (stop := self._boundary(decision_events)):
            return stop
        # Otherwise no boundary here: the claim that started this segment just renewed the
        # lease, and the next step's boundary or fence stamp saves the state (with the decision
        # applied) and notices a cancel. Should the segment die before that, only reads can
        # have run, and the next segment re-applies the stored decision (idempotent).
        cap = self._round_cap()
        if self.state.turn is None and (recorded := self._answered()) is not None:
            # A final answer recorded before it was settled (a row from before the answer and
            # its settle became one write): settle from it, never ask the model again (unless
            # it fails the output schema: sent back, ``_final_answer``).
            stop = self._final_answer(recorded, None, truncated=self.state.iteration >= cap)
            if stop is not None:
                return stop
        while True:
            if self._stopping():
                return self._hand_back(at="round")
            if self.state.turn is not None:
                if stop := self._run_turn(self.state.turn):
                    return stop
                self.state.turn = None
                continue
            final = self.state.iteration >= cap
            answer = self._call_provider(final=final)
            if isinstance(answer, Stop):
                return answer
            reply, answered = answer
            if final or not reply.tool_calls:
                # The final answer is recorded by the settle itself: one write, no gap.
                if stop := self._final_answer(reply.content or "", answered, truncated=final):
                    return stop
                continue  # sent back for not matching the output schema: asked again
            # Otherwise the turn was saved with the llm event; the next pass executes it.

    def _answered(self) -> str | None:
        """The content of the dialogue's final answer, when it ends with one."""
        last = self.messages[-1] if self.messages else {}
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            return str(last.get("content") or "")
        return None

    def _round_cap(self) -> int:
        limit = app_settings().max_iterations
        requested = self.request.get("max_iterations")
        configured = self.config.max_iterations
        cap = requested if isinstance(requested, int) and requested > 0 else configured
        return max(1, min(int(cap), limit))

    # -- a turn --

    def _run_turn(self, turn: Turn) -> Stop | None:
        if stop := self._answer_invalid_arguments(turn):
            return stop
        if turn.approved is None and any(
            self.gate.needs_approval(c.name) for c in turn.open_calls()
        ):
            return self._suspend_for_approval(turn)
        for index, call in enumerate(turn.calls):
            last_of_turn = index == len(turn.calls) - 1
            if call.id in turn.done:
                continue
            if index > 0 and self._stopping():  # the first call: checked before the turn
                return self._hand_back(at="call")
            tool = self.gate.available(call.name)
            needs_approval = tool is None or tool.needs_approval
            if turn.approved is False:  # denied: nothing of the turn executes
                stop = self._record_denied(turn, call, last_of_turn=last_of_turn)
            elif needs_approval and turn.approved is None:
                # Judged on the tool as it is now, not as the scan above found it: a call whose
                # tool came to need a decision while an earlier call ran (an approval switch
                # turned on, a tool gone) runs only after one. The rest of the turn waits.
                return self._suspend_for_approval(turn)
            elif tool is not None and tool.input_schema is not None:
                values = turn.inputs.get(call.id)
                if values is None:
                    return self._suspend_for_input(call, tool)
                arguments = overlay_input(tool, call.arguments, values)
                stop = self._execute(turn, call, tool, arguments, last_of_turn=last_of_turn)
            elif (stop := self._preview_changed(turn, call, tool)) is not None:
                return stop
            else:
                stop = self._execute(turn, call, tool, call.arguments, last_of_turn=last_of_turn)
            if stop:
                return stop
        return None

    def _answer_invalid_arguments(self, turn: Turn) -> Stop | None:
        """Calls whose arguments break their tool's schema are answered to the model as errors
        at once — never shown for approval, never run."""
        refused = []
        for call in turn.open_calls():
            tool = self.gate.available(call.name)
            reason = argument_errors(tool, call.arguments) if tool is not None else None
            if reason is not None:
                turn.done.append(call.id)
                refused.append(refused_event(call, reason))
            elif tool is not None:
                self._accepted[call.id] = (tool, call.arguments)
        return self._boundary(refused) if refused else None

    def _record_denied(self, turn: Turn, call: Call, *, last_of_turn: bool) -> Stop | None:
        turn.done.append(call.id)
        denied = denied_event(call, by=turn.denied_by, decider=turn.decider, reason=turn.reason)
        return self._step_done([denied], clear_fence=False, last_of_turn=last_of_turn)

    def _execute(
        self, turn: Turn, call: Call, tool: Tool | None, arguments: Any, *, last_of_turn: bool
    ) -> Stop | None:
        effect = tool.effect if tool is not None else Effect.NON_IDEMPOTENT_WRITE
        if effect in WRITE_EFFECTS:
            self._fenced_effect = str(effect)
        accepted = self._accepted.pop(call.id, None)
        step = execute_tool_call(
            tool=tool,
            name=call.name,
            call_id=call.id,
            arguments=arguments,
            lease=self.lease,
            initiator_id=self.run.initiator_id,
            run_uuid=self.run.uuid,
            # A write's stamp also saves the state: a decision applied by this segment is
            # durable before the write starts (a reconciliation must find the turn approved).
            loop_state=self.state.to_json() if effect in WRITE_EFFECTS else None,
            # Not checked twice: the same tool and the very arguments accepted before the turn
            # ran (identity: a tool resolved afresh, or arguments with a person's input laid
            # over them, are checked again).
            checked=accepted is not None and accepted[0] is tool and accepted[1] is arguments,
        )
        if step.interrupted:  # a read cut off because the worker is stopping: it runs again
            return self._hand_back(at="read")
        if step.result is None:  # the fence stamp matched no row: the write did not start
            return self._lost(at="fence")
        result = step.result
        if result.in_doubt and effect == Effect.NON_IDEMPOTENT_WRITE:
            return self._park_in_doubt(call, arguments, result.error, lost=step.lease_lost)
        turn.done.append(call.id)
        payload: dict[str, Any] = {"call_id": call.id, "name": call.name, **edited_marks(call)}
        if arguments != call.arguments:
            # Only when they are not the proposed ones (a person's input was merged in): the
            # ``llm`` event that proposed the call already stores them (docs/design.md §1.9).
            payload["arguments"] = arguments
        payload.update(
            {
                "effect": str(effect),
                "outcome": "executed",
                "ok": result.ok,
                "result": result.content,
                "error": result.error,
                "idempotency_key": f"{self.run.uuid}:{call.id}",
            }
        )
        if result.normalised:  # what was changed so that the result could be stored (§4.1)
            payload["normalised"] = list(result.normalised)
        event = EventSpec(
            EventKind.TOOL,
            payload,
            duration_ms=step.duration_ms,
            shown={"arguments": arguments},
        )
        if step.lease_lost:  # the ticker's renewal matched no row while the call ran
            return self._lost(at="tool", completed=[event])
        return self._step_done(
            [event], clear_fence=effect in WRITE_EFFECTS, last_of_turn=last_of_turn
        )


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
    (``wake``: a worker's segment) or is lost. ``reload_run=False``: see
    ``RunSegment.execute``. ``run``: the row, with its configuration, as the transition that
    made ``lease`` wrote it (``Decided.run``, ``Claimed.run``), instead of reading it again;
    ``events``: all of the run's events, when that transition knows them (``Claimed.events``)."""
    segment = RunSegment(lease, retry=retry, wake=wake, observer=observer, run=run, events=events)
    return segment.execute(reload_run=reload_run)
