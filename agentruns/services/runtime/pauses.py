"""The segment's pauses and endings: the previews and the suspend for a decision, the preview
re-checked before an approved write (compare-and-swap), the suspend for input, the in-doubt
park, and the settle (docs/design.md §5, §6, §9.1). The base of ``ProviderStep`` and so of
``RunSegment``, which provides the state, the lease and the boundaries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentruns import budgets, transitions
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    Effect,
    EventKind,
    Status,
    TerminationReason,
)
from agentruns.services import dispatch
from agentruns.services.runtime.failures import totals
from agentruns.services.runtime.previewing import (
    make_preview,
    preview_changed_event,
    preview_open_calls,
)
from agentruns.services.runtime.results import EventObserver, Outcome, Stop
from agentruns.services.runtime.structured_output import judge
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.tools import Tool
from agentruns.tools.gate import ToolGate
from agentruns.transitions.deadlines import WaitDeadline
from agentruns.turns import Call, LoopState, PendingTurn, Preview, Turn


class Pauses:
    """Suspends and settles a segment. Needs the segment's state and its boundaries."""

    lease: Lease
    run: AgentRun
    config: AgentConfiguration
    state: LoopState
    gate: ToolGate
    observer: EventObserver | None
    _deferred: list[EventSpec]
    _deferred_clear: bool
    _parked: AgentRun | None
    _charge: budgets.Charge | None  # ProviderStep's: an answer's cost not yet in the ledger

    def _boundary(self, events: list[EventSpec], *, clear_fence: bool = False) -> Stop | None:
        raise NotImplementedError

    def _charged(self, write: Callable[[], bool]) -> bool:
        raise NotImplementedError

    def _flush(self) -> Stop | None:
        raise NotImplementedError

    def _lost(self, *, completed: list[EventSpec] | None = None, **detail: Any) -> Stop:
        raise NotImplementedError

    # -- previews --

    def _preview(self, tool: Tool, call: Call) -> Preview | None:
        return make_preview(
            tool,
            call,
            run_uuid=self.run.uuid,
            initiator_id=self.run.initiator_id,
            fencing_token=self.lease.epoch,
        )

    def _suspend_for_approval(self, turn: Turn) -> Stop:
        """Suspend for a decision on the turn's open calls, each write previewed first (the
        previews are kept on the turn too: the digest that binds the decision covers them)."""
        with LeaseTicker(self.lease):
            preview_open_calls(turn, tool_of=self.gate.available, preview=self._preview)
        return self._suspend(
            Status.WAITING_FOR_APPROVAL,
            PendingTurn.for_approval(self.gate.shown(c) for c in turn.open_calls()),
            Outcome.AWAITING_APPROVAL,
        )

    def _preview_changed(self, turn: Turn, call: Call, tool: Tool | None) -> Stop | None:
        """Compare-and-swap: before an approved call whose approval showed a preview runs, the
        preview is made again. ``None``: the same (or nothing to compare) — run it. Otherwise
        nothing runs: a ``verification`` event records both previews and the turn waits for
        approval again on a fresh card. Off when the configuration keeps previews as
        snapshots."""
        approved = call.preview
        if (
            tool is None
            or approved is None
            or not approved.ok
            or turn.approved is not True
            or self.config.preview_is_snapshot
        ):
            return None
        with LeaseTicker(self.lease) as ticker:
            fresh = self._preview(tool, call)
        if ticker.lost:
            return self._lost(at="preview")
        if approved.still_holds(fresh):
            return None
        turn.approved = None
        changed = preview_changed_event(call, approved, fresh)
        return self._boundary([changed]) or self._suspend_for_approval(turn)

    # -- suspending --

    def _park_in_doubt(self, call: Call, arguments: Any, reason: str, *, lost: bool) -> Stop:
        """A non-idempotent write whose tool could not tell whether it happened is in doubt,
        exactly like one whose segment died: never reported to the model as a failure (it would
        propose it again, under a new key), never retried. The run waits for reconciliation with
        the fence kept (docs/design.md §9.1)."""
        stamped = Call(call.id, call.name, arguments=arguments, effect=Effect.NON_IDEMPOTENT_WRITE)
        doubt = EventSpec(
            EventKind.IN_DOUBT,
            {"call_id": call.id, "name": call.name, "arguments": arguments, "error": reason},
        )
        if lost:
            return self._lost(at="tool", completed=[doubt])
        if stop := self._flush():
            return stop
        check = dispatch.initial_check(self.gate.available(call.name))
        pending = PendingTurn.in_doubt(
            stamped,
            run_uuid=self.run.uuid,
            segment=self.lease.owner,
            lease_epoch=self.lease.epoch,
            reason=reason,
            check=check,
        )
        if transitions.run_park_in_doubt(
            self.lease, pending_turn=pending, loop_state=self.state.to_json(), events=[doubt]
        ):
            if check is not None:  # the call's tool checks whether it landed (§9.2)
                dispatch.check_after_commit(str(self.run.uuid))
            if self.observer is not None:
                self.observer(doubt)
            return Stop(Outcome.AWAITING_RECONCILIATION)
        return self._lost(completed=[doubt])

    def _suspend(self, status: str, pending: PendingTurn, outcome: str) -> Stop:
        # Deferred steps (the answer that proposed the turn) are written with the suspend; a
        # deferred fence clear needs a boundary of its own first.
        if self._deferred_clear and (stop := self._flush()):
            return stop
        carried, self._deferred = self._deferred, []
        written: list[AgentRun] = []
        cost = self.state.usage.cost if self._charge is not None else None
        if self._charged(
            lambda: transitions.run_suspend(
                self.lease,
                status=status,
                pending_turn=pending,
                loop_state=self.state.to_json(),
                deadline=WaitDeadline.of(self.config),
                events=carried,
                written=written,
                cost=cost,
            )
        ):
            if written:
                self._parked = written[0]
                self._parked.configuration = self.config  # as read by this segment
            if self.observer is not None:
                for spec in carried:
                    self.observer(spec)
            return Stop(outcome)
        # Cancelled (or lost) meanwhile: never announce a resumable pause.
        lost = self._lost(completed=carried)
        return lost if lost.outcome == Outcome.CANCELLED else Stop(Outcome.SUSPEND_FAILED)

    def _suspend_for_input(self, call: Call, tool: Tool) -> Stop:
        pending = PendingTurn.for_input(self.gate.shown(call), tool.input_schema or {})
        return self._suspend(Status.WAITING_FOR_INPUT, pending, Outcome.AWAITING_INPUT)

    # -- endings --

    def _settle(
        self,
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
        same write. ``None``: settled."""
        columns = totals(self.state, truncated=truncated)
        if output_object is not None:  # a structured answer (``structured_output``)
            columns["output_object"] = output_object
        if stop := self._flush():
            return stop
        settled = self._charged(
            lambda: transitions.run_settle(
                run_id=self.lease.run_id,
                lease=self.lease,
                status=status,
                reason=reason,
                output=output,
                error=error,
                totals=columns,
                events=events or (),
            )
        )
        if not settled:
            return self._lost(completed=events)
        if self.observer is not None:
            for spec in events or ():
                self.observer(spec)
        return None

    def _settle_completed(
        self,
        output: str,
        answered: EventSpec | None,
        *,
        truncated: bool,
        output_object: Any = None,
    ) -> Stop:
        reason = TerminationReason.MAX_ITERATIONS if truncated else TerminationReason.COMPLETED
        stop = self._settle(
            Status.COMPLETED,
            reason,
            output=output,
            truncated=truncated,
            events=[answered] if answered is not None else None,
            output_object=output_object,
        )
        return stop or Stop.of(Outcome.COMPLETED, reason=reason)

    def _final_answer(
        self, content: str, answered: EventSpec | None, *, truncated: bool
    ) -> Stop | None:
        """Settle the final answer ``content`` (its event ``answered``, unless already recorded)
        — unless the configuration's ``output_schema`` refuses it (``structured_output.judge``):
        the first time it is recorded with what failed and ``None`` says ask again; the next
        time the run ends ``failed`` / ``bad_output``."""
        judged = judge(self.config.output_schema, content, self.state)
        recorded = [answered] if answered is not None else []
        if judged.repair is not None:
            return self._boundary([*recorded, judged.repair])
        if judged.failure is not None:
            reason = TerminationReason.BAD_OUTPUT
            error_event = EventSpec(EventKind.ERROR, dict(judged.failure))
            stop = self._settle(
                Status.FAILED, reason, error=judged.failure, events=[*recorded, error_event]
            )
            return stop or Stop.of(Outcome.FAILED, reason=reason)
        return self._settle_completed(
            content, answered, truncated=truncated, output_object=judged.value
        )
