"""A stretch of an external agent loop's work under its run's lease: ``Holding``
(docs/external.md).

A holding is a segment whose steps a framework takes instead of Leasehold's loop. It is built
from the runtime's own parts: the ``Segment`` and ``SegmentState`` values, the boundary writer
(``Boundaries``: every write owner-guarded, a lost lease or a cancel noticed the same way), the
turn step (``turn_step.run_turn`` / ``run_call``: argument checks, the suspend for approval with
previews, denials, answers, input, compare-and-swap, the fence stamp and clear, the in-doubt
park), the decision's application (``verdicts.apply_decision``) and the ticker that keeps the
lease alive (``LeaseTicker``) — for the whole stretch, since the framework's own model calls
happen between its tool calls.

What the framework proposes is recorded as the run's turn (``loop_state.turn``) with an ``llm``
event naming the framework, so the inbox shows it, previews it and binds the decision to its
digest exactly as for a native run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from django.urls import NoReverseMatch, reverse

from agentruns import transitions
from agentruns.conf import app_settings
from agentruns.exceptions import InvalidRequest
from agentruns.external import _calls
from agentruns.external.errors import (
    LeaseLost,
    RunCancelled,
    RunPaused,
    StateNotStorable,
    StateTooLarge,
)
from agentruns.external.values import (
    APPROVED,
    DENIED,
    DONE,
    UNDECIDED,
    CallOutcome,
    Card,
    ProposedCall,
    Verdict,
)
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.providers import Provider
from agentruns.services.runtime import turn_step
from agentruns.services.runtime.boundaries import Boundaries
from agentruns.services.runtime.results import Outcome, Stop
from agentruns.services.runtime.segment_state import Segment, SegmentState
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.verdicts import apply_decision
from agentruns.storable import json_problem, text_problem
from agentruns.tools.gate import ToolGate
from agentruns.tools.shown import shown_turn
from agentruns.transitions.external import run_save_external_state
from agentruns.turns import Call, LoopState, Turn, read_pending_turn
from agentruns.versions import pin

logger = logging.getLogger(__name__)

HELD = "held"
PAUSED = "paused"
RELEASED = "released"
ENDED = "ended"
LOST = "lost"

_PAUSES = (Outcome.AWAITING_APPROVAL, Outcome.AWAITING_INPUT, Outcome.AWAITING_RECONCILIATION)


def _no_provider() -> Provider:
    raise RuntimeError("an external run has no Leasehold provider: its framework asks its model")


def checked_state(state: Any) -> Any:
    """``state`` if a run may store it as its framework state: JSON a column can store, at most
    ``EXTERNAL_STATE_MAX_BYTES`` of it. ``StateNotStorable`` / ``StateTooLarge`` otherwise."""
    if (problem := json_problem(state)) is not None:
        raise StateNotStorable(f"the framework state cannot be stored: {problem}")
    size = len(json.dumps(state, ensure_ascii=False).encode("utf-8"))
    limit = app_settings().external_state_max_bytes
    if size > limit:
        raise StateTooLarge(
            f"the framework state is {size} bytes of JSON; at most {limit} are stored "
            "(AGENTRUNS['EXTERNAL_STATE_MAX_BYTES'])",
            size=size,
            limit=limit,
        )
    return state


class Holding:
    """The lease on one run, held by an external agent loop for a stretch of its work. Use it
    as a context manager (``with external.hold(...) as run:``): leaving releases the run to the
    queue of its framework (``released``), unless it paused for a person, ended, or lost its
    lease; an exception escaping while a call ran leaves the lease to expire instead (a write
    may be in flight: the reaper decides, as for a process that died).

    Every method raises ``LeaseLost`` (``RunCancelled`` for a cancel) once the lease is lost,
    before anything more is written or run, and ``RunPaused`` once the run waits for a person.
    """

    def __init__(
        self,
        *,
        lease: Lease,
        run: AgentRun,
        loop: LoopState,
        framework: str,
    ) -> None:
        self.lease = lease
        self.run = run
        self.framework = framework
        #: The decision a person (or a deadline, or a check) made while the run waited, as
        #: applied when this holding claimed it (``None``: none) — for the framework's resume.
        self.decision: dict[str, Any] | None = None
        #: The card of the pause, once the run waits for a person.
        self.card: Card | None = None
        self.phase = HELD
        self._framework_state = run.external_state
        request = run.request if isinstance(run.request, dict) else {}
        self._seg = Segment(
            lease=lease,
            run=run,
            config=pin(run).configuration,  # the version the run pinned
            request=request,
            gate=ToolGate.of(run),
            provider=_no_provider,
            rounds=0,
        )
        self._state = SegmentState(loop=loop)
        self._written: dict[str, dict[str, Any]] = {}
        self._writer = Boundaries(self._seg, observer=self._observe)
        self._ticker = LeaseTicker(lease)
        self._ticker.__enter__()
        self._ticking = True
        self._in_call = False

    # -- what the run is --

    @property
    def run_uuid(self) -> str:
        return str(self.lease.uuid)

    @property
    def state(self) -> Any:
        """The framework state stored with the run (``None``: none)."""
        return self._framework_state

    @property
    def loop(self) -> LoopState:
        return self._state.loop

    # -- the context manager --

    def __enter__(self) -> Holding:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._in_call:
            # A call was running: its write may be in flight. Nothing is released; the lease
            # runs out and the reaper decides (in doubt for a fenced non-idempotent write).
            logger.warning("run %s: left during a call; its lease is left to expire", self.run_uuid)
            self._stop_ticker()
            self.phase = LOST
            return
        try:
            self.release()
        except LeaseLost:
            if exc_type is None:
                raise  # the caller learns the lease was lost; never hides its own exception

    def release(self) -> None:
        """Hand the run back to its framework's queue (``queued``, no claim, the budget
        untouched) with a ``lease`` event ``released``. Nothing when it is not held."""
        if self.phase != HELD:
            return
        self._stop_ticker()
        event = EventSpec(EventKind.LEASE, {"action": "released", "framework": self.framework})
        if self._ticker.lost or not transitions.run_hand_back(
            self.lease, loop_state=self.loop.to_json(), events=[event]
        ):
            self._end(self._writer.lost(self._state, at="release"))
            return
        self.phase = RELEASED

    # -- the framework's state --

    def save_state(self, state: Any) -> None:
        """Store ``state`` (JSON: a LangGraph thread id, an Agents SDK ``RunState``) with the run,
        to resume from. Allowed while held, and after this holding paused the run until
        someone claims it again. Refused: ``StateTooLarge``, ``StateNotStorable``;
        ``LeaseLost`` when the run moved on."""
        checked_state(state)
        if self.phase == HELD:
            self._live()
        elif self.phase != PAUSED:
            raise LeaseLost("the run is no longer held by this loop")
        if not run_save_external_state(self.lease, state=state, paused=self.phase == PAUSED):
            if self.phase == HELD:
                self._live(force_check=True)
            raise LeaseLost("the run moved on before its state was saved")
        self._framework_state = state

    # -- calls --

    def propose(self, calls: Sequence[ProposedCall]) -> None:
        """Record the calls the framework's model proposed as the run's turn, with an ``llm``
        event naming the framework. A call seen before (same id and arguments) is not proposed
        again; new calls join the open turn while nobody decided it and nothing of it ran,
        else they start a new one (the framework moved on: the old one's open calls never
        run)."""
        self._live()
        fresh = self._fresh_calls([_calls.checked(call) for call in calls])
        if not fresh:
            return
        turn = self.loop.turn
        if turn is None or turn.approved is not None or turn.done:
            turn = Turn(calls=[])
            self.loop.turn = turn
        turn.calls.extend(fresh)
        proposed = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in fresh]
        answer = EventSpec(
            EventKind.LLM,
            {
                "content": "",
                "tool_calls": proposed,
                "usage": {},
                "model": self.framework,
                "framework": self.framework,
            },
        )
        self._stop_if(self._writer.write(self._state, [answer]))

    def _fresh_calls(self, calls: list[ProposedCall]) -> list[Call]:
        turn = self.loop.turn
        open_ids = {c.id for c in turn.open_calls()} if turn is not None else set()
        fresh: list[Call] = []
        for call in calls:
            call_id, known = _calls.leasehold_id(self.loop, call)
            if call_id in open_ids or any(c.id == call_id for c in fresh):
                continue
            if known and self._payload(call_id) is not None:
                continue
            _calls.remember(self.loop, call_id, call)
            # The effect as proposed, for display (docs/design.md §1.4), as a native turn's.
            effect = self._seg.gate.effect(call.name)
            fresh.append(Call(id=call_id, name=call.name, arguments=call.arguments, effect=effect))
        return fresh

    def recorded(self, call: ProposedCall) -> CallOutcome | None:
        """What the run recorded for ``call`` (its ``tool`` event), or ``None``: it never ran,
        was never denied, answered or reconciled. A replay returns this and runs nothing."""
        call = _calls.checked(call)
        call_id, known = _calls.leasehold_id(self.loop, call)
        if not known:
            return None
        payload = self._payload(call_id)
        if payload is None:
            return None
        return _calls.outcome_of(payload, run_uuid=self.run_uuid, call_id=call_id, recorded=True)

    def needs_approval(self, call: ProposedCall) -> bool:
        """Whether ``call`` must wait for a person before it runs: it is not recorded and its
        turn waits for a decision (any open call of an undecided turn needing one makes the
        whole turn wait, reads included). Proposes it first when it is new."""
        if self.recorded(call) is not None:
            return False
        self.propose([call])
        return turn_step.waits_for_approval(self.loop.turn, self._seg.gate)

    def verdict(self, call: ProposedCall) -> Verdict:
        """Where ``call`` stands: recorded (``done``, or ``denied`` with the reviewer's words),
        ``approved`` (it may run now), or ``undecided``. A call of a turn a person denied is
        settled as denied here (its ``tool`` event written), so the framework can skip it."""
        call = _calls.checked(call)
        if (outcome := self.recorded(call)) is not None:
            return Verdict(call.id, DENIED if outcome.outcome == DENIED else DONE, outcome)
        if self.needs_approval(call):
            return Verdict(call.id, UNDECIDED)
        turn = self.loop.turn
        if turn is not None and turn.approved is False:
            outcome = self.execute(call)
            return Verdict(call.id, DENIED if outcome.outcome == DENIED else DONE, outcome)
        return Verdict(call.id, APPROVED)

    def execute(self, call: ProposedCall) -> CallOutcome:
        """Run ``call`` through the run, as a native run's turn step runs it: arguments checked,
        the whole turn suspended for a decision when it waits for one (``RunPaused`` with the
        card), a denial or a person's answer recorded instead of running, a previewed write
        previewed again (compare-and-swap), then the tool behind the fence (its effect stamped
        on the row under the owner guard — ``LeaseLost`` before the body when the lease is
        gone), its ``tool`` event written as it clears the fence; a non-idempotent write whose
        tool raises ``OutcomeUnknown`` parks the run in doubt (``RunPaused``). A call recorded
        before returns its recorded outcome and runs nothing."""
        call = _calls.checked(call)
        if (outcome := self.recorded(call)) is not None:
            return outcome
        self.propose([call])
        call_id, _ = _calls.leasehold_id(self.loop, call)
        turn = self.loop.turn
        stored = turn.call(call_id) if turn is not None else None
        if turn is None or stored is None:  # pragma: no cover - propose put it there
            raise RuntimeError(f"call {call.id!r} was not recorded")
        self._stop_if(
            self._in(lambda: turn_step.run_call(self._state, self._seg, self._writer, turn, stored))
        )
        self._close_turn()
        return self._outcome(call_id, recorded=False)

    def run_turn(self, calls: Sequence[ProposedCall]) -> list[CallOutcome]:
        """Propose ``calls`` (one model answer) and run every call of the turn not done, in
        order, as ``execute`` runs one: the outcome of each of ``calls`` (recorded ones
        returned as recorded). ``RunPaused`` when the turn waits for a person or a write went
        in doubt."""
        checked = [_calls.checked(call) for call in calls]
        before = [self.recorded(call) for call in checked]
        self.propose(checked)
        turn = self.loop.turn
        if turn is not None and turn.open_calls():
            ran = self._in(lambda: turn_step.run_turn(self._state, self._seg, self._writer, turn))
            self._stop_if(ran if isinstance(ran, Stop) else self._writer.flush(self._state))
            self._close_turn()
        return [
            known or self._outcome(_calls.leasehold_id(self.loop, call)[0], recorded=False)
            for call, known in zip(checked, before, strict=True)
        ]

    # -- pausing and ending --

    def suspend(self, *, state: Any = None) -> Card:
        """Suspend the run for a decision on its open turn (each write previewed first), after
        saving ``state`` when given: the run waits in the inbox, this holding lets it go.
        Returns the card."""
        self._live()
        if state is not None:
            self.save_state(state)
        turn = self.loop.turn
        if turn is None or not turn.open_calls():
            raise InvalidRequest("there is no open turn to decide")
        stop = turn_step.suspend_for_approval(self._state, self._seg, self._writer, turn)
        card = self._end(stop)
        if card is None:  # pragma: no cover - a suspend either pauses or raises
            raise LeaseLost("the suspend did not take effect")
        return card

    def complete(self, output: str = "") -> None:
        """Settle the run ``completed`` with ``output`` (the framework's final answer)."""
        if (problem := text_problem(output)) is not None:
            raise InvalidRequest(f"the output holds {problem}", field="output")
        self._live()
        # The framework's final answer, recorded by the settle itself as a native run's is.
        answer = EventSpec(
            EventKind.LLM,
            {
                "content": output,
                "tool_calls": [],
                "usage": {},
                "model": self.framework,
                "framework": self.framework,
            },
        )
        self._settled(
            self._writer.settle(
                self._state,
                Status.COMPLETED,
                TerminationReason.COMPLETED,
                output=output,
                events=[answer],
            )
        )

    def fail(self, message: str) -> None:
        """Settle the run ``failed`` / ``external_failed``: the loop gave up (``message`` is
        recorded as the run's error, cut to 500 characters)."""
        self.settle_failed(TerminationReason.EXTERNAL_FAILED, "ExternalLoopFailed", message)

    def settle_failed(self, reason: str, error_type: str, message: str) -> None:
        self._live()
        error = {"type": error_type, "message": str(message)[:500]}
        self._settled(self._writer.settle(self._state, Status.FAILED, reason, error=error))

    def apply_decision(self) -> None:
        """Apply the decision recorded while the run waited (``verdicts.apply_decision``: an
        approval only to the turn whose digest it bound, else a ``verification`` event and a
        fresh card; denials and answers per call and a reconciliation verdict as the ``tool``
        events the model reads) and write it at once. Done by ``hold``; nothing when none."""
        decision = self.loop.decision
        if decision is None:
            return
        self.decision = decision.to_json()
        events = apply_decision(self.loop, gate=self._seg.gate)
        self._close_turn()
        self._live()
        self._stop_if(self._writer.write(self._state, events))

    # -- helpers --

    def _observe(self, spec: EventSpec) -> None:
        if spec.kind == EventKind.TOOL and isinstance(spec.payload.get("call_id"), str):
            self._written[spec.payload["call_id"]] = spec.payload

    def _payload(self, call_id: str) -> dict[str, Any] | None:
        if call_id in self._written:
            return self._written[call_id]
        return _calls.recorded_payload(self.lease.run_id, call_id)

    def _outcome(self, call_id: str, *, recorded: bool) -> CallOutcome:
        payload = self._payload(call_id)
        if payload is None:  # pragma: no cover - a call done has its event
            raise RuntimeError(f"call {call_id!r} has no recorded outcome")
        return _calls.outcome_of(
            payload, run_uuid=self.run_uuid, call_id=call_id, recorded=recorded
        )

    def _close_turn(self) -> None:
        turn = self.loop.turn
        if turn is not None and not turn.open_calls():
            self.loop.turn = None

    def _in(self, step: Callable[[], Any]) -> Any:
        """Run a step that may execute a tool: an exception escaping it leaves the lease to
        expire (``__exit__``)."""
        self._live()
        self._in_call = True
        result = step()
        self._in_call = False
        return result

    def _live(self, *, force_check: bool = False) -> None:
        """Raise unless the run is held: ``RunPaused``, ``LeaseLost``/``RunCancelled`` (a lost
        lease the ticker found is noticed here, a cancel recorded as one)."""
        if self.phase == PAUSED:
            raise RunPaused(card=self.card)
        if self.phase != HELD:
            raise LeaseLost(f"the run is not held by this loop ({self.phase})")
        if self._ticker.lost or force_check:
            self._end(self._writer.lost(self._state, at="ticker"))

    def _stop_if(self, stop: Stop | None) -> None:
        """A step's ``Stop``: the run paused (``RunPaused``), was cancelled or lost."""
        if stop is None:
            return
        card = self._end(stop)
        raise RunPaused(card=card, status=card.status if card is not None else "")

    def _settled(self, stop: Stop | None) -> None:
        if stop is not None:
            self._end(stop)
        self._stop_ticker()
        self.phase = ENDED

    def _end(self, stop: Stop) -> Card | None:
        """The holding's end by ``stop``: the card of a pause; raises for a cancel or a lost
        lease."""
        self._stop_ticker()
        if stop.outcome in _PAUSES:
            self.phase = PAUSED
            self.card = self._card(stop.run)
            return self.card
        if stop.outcome == Outcome.CANCELLED:
            self.phase = ENDED
            raise RunCancelled()
        self.phase = LOST
        raise LeaseLost()

    def _card(self, parked: AgentRun | None) -> Card:
        run = parked if parked is not None else self._reloaded()
        # As the inbox's card shows it (each call's tool read now), with the digest it sends.
        pending = shown_turn(run, read_pending_turn(run), gate=self._seg.gate)
        try:
            path = reverse("approvals:run", kwargs={"run_uuid": run.uuid})
        except NoReverseMatch:
            path = ""
        return Card(
            run_uuid=self.run_uuid,
            framework=self.framework,
            status=str(run.status),
            kind=str(pending.kind),
            turn_digest=pending.turn_digest,
            calls=tuple(call.to_json() for call in pending.calls),
            review_path=path,
        )

    def _reloaded(self) -> AgentRun:
        return AgentRun.objects.get(pk=self.lease.run_id)

    def _stop_ticker(self) -> None:
        if self._ticking:
            self._ticking = False
            self._ticker.__exit__(None, None, None)
