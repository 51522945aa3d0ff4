"""The boundary writer: every write a segment makes under its lease (docs/design.md §3, §6.4).

Each method is one owner-guarded write through ``agentruns.transitions`` and what follows it: the
segment's unwritten steps carried (``SegmentState.unwritten``), an answer's pending charge to the
spend ledger in the same transaction, the events shown to the observer once committed. A write
that matches no row means the lease is lost or the run was cancelled: ``lost`` records what it
can and the segment stops at once — no settle, no further provider or tool call (§3.5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DatabaseError, transaction

from agentruns import budgets, tracing, transitions
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec
from agentruns.models import Effect, EventKind, Status, TerminationReason
from agentruns.services import dispatch
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.failures import totals
from agentruns.services.runtime.results import EventObserver, Outcome, Stop, Waker
from agentruns.services.runtime.segment_state import Finished, Segment, SegmentState
from agentruns.tools.mcp_sessions import SessionScope
from agentruns.transitions.deadlines import WaitDeadline
from agentruns.turns import PendingTurn

logger = logging.getLogger(__name__)

#: What a guarded write returns: a verdict (bool) or the row it wrote (``None``: no match).
_Written = TypeVar("_Written")

# Kinds of event that record a step that happened: kept in the audit when a cancel is noticed.
_COMPLETED_KINDS = (EventKind.TOOL, EventKind.LLM, EventKind.IN_DOUBT)


@dataclass(frozen=True)
class Boundaries:
    """Writes ``seg``'s boundaries, suspends, settles and hand-backs. ``observer`` sees every
    event once its write committed; ``wake`` (workers only) sends the wake-up of a run handed
    back because the worker is stopping (without it a segment never hands back); ``sessions``
    (the segment's remote sessions) are closed as soon as the lease is found lost."""

    seg: Segment
    observer: EventObserver | None = None
    wake: Waker | None = None
    sessions: SessionScope | None = None

    # -- step boundaries --

    def write(
        self, state: SegmentState, events: list[EventSpec], *, clear: str = ""
    ) -> Stop | None:
        """A step boundary: renew the lease, save the loop state, append the unwritten steps and
        ``events``; ``clear`` (or a deferred clear): the effect of the write whose fence it
        clears (``run_clear_fence``, which commits itself for a non-idempotent write).
        ``None``: written."""
        deferred, deferred_clear = state.unwritten.take()
        clear = clear or deferred_clear
        written = [*deferred, *events]
        cost = state.cost_to_record()
        loop_state = state.loop.to_json()
        lease = self.seg.lease
        if clear:
            in_doubt = clear == Effect.NON_IDEMPOTENT_WRITE

            def guarded() -> bool:
                return transitions.run_clear_fence(
                    lease,
                    loop_state=loop_state,
                    events=written,
                    cost=cost,
                    in_doubt_unless_committed=in_doubt,
                )

        else:

            def guarded() -> bool:
                return transitions.run_heartbeat(
                    lease, loop_state=loop_state, events=written, cost=cost
                )

        if not self._charged(state, guarded):
            return self.lost(state, completed=written)
        for spec in events:  # the deferred ones joined the dialogue when they were deferred
            state.remember(spec)
        self._observe(written)
        return None

    def step_done(
        self, state: SegmentState, events: list[EventSpec], *, clear: str, last_of_turn: bool
    ) -> Stop | None:
        """Record a completed tool step: at once, or, for the last call of a turn, with the next
        boundary. Nothing with a side effect happens in between (the loop goes straight to the
        ``request`` boundary), so a crash there loses exactly what a crash inside the call
        would: the call is executed again (or, fenced non-idempotent, reconciled)."""
        if not last_of_turn:
            return self.write(state, events, clear=clear)
        state.unwritten.defer(events, clear=clear)
        for spec in events:
            state.remember(spec)
        return None

    def defer(self, state: SegmentState, spec: EventSpec) -> None:
        """Record ``spec`` with the next write (it joins the dialogue now)."""
        state.unwritten.defer([spec])
        state.remember(spec)

    def flush(self, state: SegmentState) -> Stop | None:
        """Write deferred steps before a write that does not carry them (suspend, settle)."""
        return self.write(state, []) if state.unwritten.events else None

    # -- the lease lost --

    def lost(
        self, state: SegmentState, *, completed: list[EventSpec] | None = None, **detail: Any
    ) -> Stop:
        """A guarded write matched nothing: the run was cancelled under us, or the lease lost.

        Every path that learns of a lost lease (a boundary, the ticker, the fence stamp) comes
        here, so a cancel is always recognised and recorded as one. On a cancel the steps that
        completed (a tool call that ran, a model answer) are recorded before the cancel event,
        so a write that happened is never missing from the audit; a lost lease records nothing.
        The segment's remote sessions are closed first: nothing more is sent under this lease.
        """
        if self.sessions is not None:
            self.sessions.close()
        deferred, _ = state.unwritten.take()
        finished = [s for s in [*deferred, *(completed or [])] if s.kind in _COMPLETED_KINDS]
        cost = state.cost_to_record()
        lease = self.seg.lease
        noticed = self._charged(
            state,
            lambda: transitions.run_notice_cancel(
                lease,
                events=[
                    *finished,
                    EventSpec(EventKind.CANCEL, {"note": "noticed at step boundary"}),
                ],
                cost=cost,
            ),
        )
        pending, state.unwritten.charge = state.unwritten.charge, None
        if not noticed and pending is not None:
            # The answer was received (and paid for) by a segment that lost its lease: the
            # ledger still counts it; the run's events and cost do not (a zombie writes none).
            try:
                budgets.charge(pending)
            except DatabaseError:
                logger.exception("run %s: could not charge a lost answer", lease.uuid)
        return Stop(Outcome.CANCELLED if noticed else Outcome.LEASE_LOST, dict(detail))

    # -- handing back (a stopping worker, docs/design.md §10.2) --

    def stopping(self) -> bool:
        """The worker was told to stop, and this segment can hand its run back."""
        return self.wake is not None and shutdown.requested()

    def hand_back(self, state: SegmentState, *, at: str) -> Stop:
        """Hand the run back to the queue at a safe point — between steps, never while a write
        is in flight — with the steps not written yet (a deferred last call; its fence is
        cleared with the claim) and a ``lease`` event ``handed_back``, and its fresh wake-up:
        one transaction (``wake``: with the ORM broker the task row is part of it; another
        broker sends after the commit). The lease is released at once: nobody waits for it to
        expire, and the retry budget is untouched. Should the process die before the commit,
        nothing of it happened: the lease runs out and the reaper decides as for any dead
        segment (a write whose clear was deferred is then in doubt)."""
        deferred, _ = state.unwritten.take()
        written = [*deferred, EventSpec(EventKind.LEASE, {"action": "handed_back", "at": at})]
        cost = state.cost_to_record()
        loop_state = state.loop.to_json()
        lease, wake = self.seg.lease, self.wake
        assert wake is not None  # ``stopping`` is checked first

        def guarded() -> bool:
            with transaction.atomic():
                if not transitions.run_hand_back(
                    lease, loop_state=loop_state, events=written, cost=cost
                ):
                    return False
                try:
                    wake(str(lease.uuid))
                except DatabaseError as exc:  # the task row: rolls the hand-back back with it
                    raise StateWriteFailed("the wake-up of a handed-back run failed") from exc
            return True

        if not self._charged(state, guarded):
            return self.lost(state, completed=deferred)
        self._observe(written)
        return Stop.of(Outcome.HANDED_BACK, at=at)

    # -- pauses --

    def suspend(self, state: SegmentState, status: str, pending: PendingTurn, outcome: str) -> Stop:
        """Suspend the run in ``status`` waiting on ``pending``; the deferred steps (the answer
        that proposed the turn) are written with it, a deferred fence clear by a boundary of its
        own first. The ``Stop`` carries the row the suspend left (the result without a read).
        Cancelled meanwhile: ``cancelled``; lost: ``suspend_failed`` (never a resumable pause)."""
        if state.unwritten.clear and (stop := self.flush(state)):
            return stop
        carried, _ = state.unwritten.take()
        cost = state.cost_to_record()
        lease, config = self.seg.lease, self.seg.config
        parked = self._charged(
            state,
            lambda: transitions.run_suspend(
                lease,
                status=status,
                pending_turn=pending,
                loop_state=state.loop.to_json(),
                deadline=WaitDeadline.of(config),
                events=carried,
                cost=cost,
            ),
        )
        if parked is None:
            lost = self.lost(state, completed=carried)
            return lost if lost.outcome == Outcome.CANCELLED else Stop(Outcome.SUSPEND_FAILED)
        parked.configuration = config  # as read by this segment
        self._observe(carried)
        return Stop(outcome, run=parked)

    def park_in_doubt(
        self, state: SegmentState, pending: PendingTurn, doubt: EventSpec, *, checked: bool
    ) -> Stop:
        """Park the run for reconciliation with the fence kept (docs/design.md §9.1), recording
        ``doubt``; ``checked``: the call's tool checks whether it landed, sent after the commit
        (§9.2). Deferred steps must have been written (``flush``)."""
        if not transitions.run_park_in_doubt(
            self.seg.lease, pending_turn=pending, loop_state=state.loop.to_json(), events=[doubt]
        ):
            return self.lost(state, completed=[doubt])
        if checked:
            dispatch.check_after_commit(str(self.seg.run.uuid))
        self._observe([doubt])
        tracing.in_doubt(self.seg.run, by="segment", call_name=str(doubt.payload.get("name")))
        return Stop(Outcome.AWAITING_RECONCILIATION)

    def requeue(self, state: SegmentState, *, error: dict[str, Any], delay: float) -> Stop | None:
        """Requeue the run after a retryable provider failure, with a ``lease`` event
        ``requeued``. ``None``: requeued (the caller schedules the wake-up)."""
        event = EventSpec(
            EventKind.LEASE, {"action": "requeued", "retry_in_seconds": delay, "error": error}
        )
        if not transitions.run_requeue(self.seg.lease, error=error, events=[event]):
            return self.lost(state)
        return None

    # -- endings --

    def settle(
        self,
        state: SegmentState,
        status: str,
        reason: str,
        *,
        output: str = "",
        error: dict[str, Any] | None = None,
        truncated: bool = False,
        events: list[EventSpec] | None = None,
        output_object: Any = None,
    ) -> Stop | None:
        """End the run in ``status`` with ``reason`` under the lease, appending ``events`` in the
        same write (deferred steps are written first); ``output_object``: a structured answer
        (``structured_output``). ``None``: settled."""
        columns = totals(state.loop, truncated=truncated)
        if output_object is not None:
            columns["output_object"] = output_object
        if stop := self.flush(state):
            return stop
        lease = self.seg.lease
        settled = self._charged(
            state,
            lambda: transitions.run_settle(
                run_id=lease.run_id,
                lease=lease,
                status=status,
                reason=reason,
                output=output,
                error=error,
                totals=columns,
                events=events or (),
            ),
        )
        if not settled:
            return self.lost(state, completed=events)
        self._observe(events or ())
        return None

    def settle_completed(
        self, state: SegmentState, finished: Finished, *, output_object: Any = None
    ) -> Stop:
        """Settle the model's final answer: ``completed``, or ``max_iterations`` when the round
        cap cut the run short; its ``llm`` event is written by the settle itself (one write, no
        gap); ``output_object``: the answer parsed, when the configuration sets a schema."""
        reason = (
            TerminationReason.MAX_ITERATIONS if finished.truncated else TerminationReason.COMPLETED
        )
        stop = self.settle(
            state,
            Status.COMPLETED,
            reason,
            output=finished.output,
            truncated=finished.truncated,
            events=[finished.answered] if finished.answered is not None else None,
            output_object=output_object,
        )
        return stop or Stop.of(Outcome.COMPLETED, reason=reason)

    # -- helpers --

    def _charged(self, state: SegmentState, write: Callable[[], _Written]) -> _Written:
        """``write`` (which records an answer's event), and the answer's charge in the spend
        ledger (``budgets.charge``) in the same transaction when one is pending: both or
        neither. Returns what ``write`` returned; falsy (``False``, ``None``): it matched no row,
        and the charge stays pending for ``lost``."""
        pending = state.unwritten.charge
        if pending is None:
            return write()
        with transaction.atomic():
            written = write()
            if not written:
                return written
            try:
                budgets.charge(pending)
            except DatabaseError as exc:  # rolls the write back with it
                raise StateWriteFailed("the spend ledger refused the charge") from exc
        state.unwritten.charge = None
        return written

    def _observe(self, written: Iterable[EventSpec]) -> None:
        if self.observer is not None:
            for spec in written:
                self.observer(spec)
