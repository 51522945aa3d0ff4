"""The provider step of a segment: the ``request`` boundary, the model call under the lease
ticker, the ``llm`` event and the turn it proposes, and what a provider failure does
(docs/design.md §6, §7.1). A base of ``RunSegment``, which provides the boundaries."""

from __future__ import annotations

import time
from typing import Any

from django.db import DatabaseError

from agentruns import budgets, transitions
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentConfiguration, AgentRun, EventKind, Status, TerminationReason
from agentruns.providers import Provider, ProviderError, ProviderReply, provider_for
from agentruns.providers.replies import check_reply
from agentruns.services.runtime.failures import provider_error, retry_policy, settle_events
from agentruns.services.runtime.pauses import Pauses
from agentruns.services.runtime.results import Outcome, RetryScheduler, Stop
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.transcript import unique_call_ids
from agentruns.tools.gate import ToolGate
from agentruns.turns import Call, LoopState, Turn

_NOT_YET = object()


class ProviderStep(Pauses):
    """Asks the model for the next turn; settles on a provider failure (``Pauses``). Needs the
    segment's state and its boundaries."""

    # The system prompt and tool names this segment's last recorded request sent.
    _system_recorded: Any = _NOT_YET
    _tools_recorded: Any = _NOT_YET

    lease: Lease
    run: AgentRun
    config: AgentConfiguration
    request: dict[str, Any]
    state: LoopState
    messages: list[dict[str, Any]]
    gate: ToolGate
    retry: RetryScheduler | None
    # An answer's cost to record in the spend ledger with the write that records its event.
    _charge: budgets.Charge | None = None
    # The segment's provider, built for its first call (the configuration is read per segment).
    _provider: Provider | None = None

    def _waits_for_approval(self) -> bool:
        raise NotImplementedError

    def _defer(self, spec: EventSpec) -> None:
        raise NotImplementedError

    # -- the provider --

    def _offered_tools(self) -> list[dict[str, Any]]:
        return self.gate.offered()

    def _call_provider(self, *, final: bool) -> tuple[ProviderReply, EventSpec] | Stop:
        tools = [] if final else self._offered_tools()
        opening = self.messages[0] if self.messages else {}
        system = opening.get("content") if opening.get("role") == "system" else None
        # What was sent, without storing the dialogue again: how many messages (the prompt,
        # then the llm and tool events before this one); the system prompt and the tools
        # offered on a segment's first request and when they change. A missing key means "as
        # the previous request" (transcript.request_messages rebuilds it; docs/design.md §1.9).
        names = [t["function"]["name"] for t in tools]
        payload: dict[str, Any] = {"iteration": self.state.iteration, "final": final}
        if system != self._system_recorded:
            payload["system"] = system
        payload["message_count"] = len(self.messages)
        if names != self._tools_recorded:
            payload["tools"] = names
        request = EventSpec(EventKind.REQUEST, payload, shown={"messages": list(self.messages)})
        reservation = self._check_budgets()
        if isinstance(reservation, Stop):
            return reservation
        if stop := self._boundary([request]):
            budgets.release(reservation)
            return stop
        self._system_recorded, self._tools_recorded = system, names
        if self._provider is None:
            self._provider = provider_for(self.config, self.request)
        provider = self._provider
        started = time.monotonic()
        with LeaseTicker(self.lease) as ticker:
            try:
                # Checked before anything of it is stored, shown or run (providers.replies).
                reply = check_reply(
                    provider.complete(
                        messages=list(self.messages), tools=tools, run_uuid=str(self.run.uuid)
                    ),
                    tokens_so_far=self.state.usage.total_tokens,
                )
            except ProviderError as exc:
                failure: ProviderError | None = exc
            else:
                failure = None
        if failure is not None:
            budgets.release(reservation)
            if ticker.lost:
                return self._lost(at="provider")
            return self._provider_failed(failure)
        duration_ms = int((time.monotonic() - started) * 1000)
        self.state.iteration += 1
        self.state.usage.add(reply.usage)
        priced = budgets.call_cost(self.config, reply.usage)
        if priced is not None or reservation is not None:
            cost = priced.cost if priced is not None else budgets.as_money(0)
            self.state.usage.cost = budgets.as_money(self.state.usage.cost + cost)
            self._charge = budgets.Charge(
                configuration_id=self.config.pk,
                initiator_id=self.run.initiator_id,
                cost=cost,
                usage_known=priced is None or priced.usage_known,
                reservation=reservation,
            )
        calls = (
            [] if final else unique_call_ids(reply.tool_calls, self.messages, self.state.iteration)
        )
        if calls:
            # Each call keeps the effect its tool declares now (shown if the turn waits).
            self.state.turn = Turn(
                calls=[
                    Call(
                        id=c.id, name=c.name, arguments=c.arguments, effect=self.gate.effect(c.name)
                    )
                    for c in calls
                ]
            )
        answered = EventSpec(
            EventKind.LLM,
            {
                "iteration": self.state.iteration,
                "final": final,
                "content": reply.content,
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                ],
                "usage": dict(reply.usage),
                "model": reply.model,
                **({"normalised": list(reply.normalised)} if reply.normalised else {}),
                **_priced(priced),
            },
            duration_ms=duration_ms,
        )
        if ticker.lost:  # the ticker's renewal matched no row while the model answered
            return self._lost(at="provider", completed=[answered])
        if final or not calls:
            return reply, answered  # the final answer: written with the settle
        if self._waits_for_approval():
            # The turn waits for a decision: the answer (and the turn) is written by the write
            # that follows — the suspend, after the previews, or a refusal's boundary — as the
            # final answer is by the settle. Nothing runs in between but the previews (reads);
            # a crash there loses the answer as a crash inside the call would (it is asked
            # again), and a cancel noticed then records it (``_lost``).
            self._defer(answered)
            return reply, answered
        return self._boundary([answered]) or (reply, answered)

    def _check_budgets(self) -> budgets.Reservation | Stop | None:
        """The budget check before a provider call (``budgets.reserve``): ``None`` when no
        budget applies, the reservation when every budget admits the call, else the run is
        settled ``failed`` / ``budget_exhausted`` with a ``budget`` event and the model is not
        called. Refused while calls in flight hold the rest of a budget, it waits for them under
        the lease ticker, the deferred steps written first (a wait must not widen the gap in
        which a crash loses them); a lease lost meanwhile ends the wait and is found by the next
        write. A database error propagates (``StateWriteFailed``): no call without a check."""
        applicable = budgets.budgets_for(
            configuration=self.config, initiator_id=self.run.initiator_id
        )
        if not applicable:
            return None
        holder = budgets.Holder.of(self.config, self.lease)
        try:
            verdict = budgets.reserve(applicable, holder=holder, waiting=lambda: False)
            if isinstance(verdict, budgets.Exhausted) and not verdict.spent:
                if stop := self._flush():
                    return stop
                with LeaseTicker(self.lease) as ticker:
                    verdict = budgets.reserve(
                        applicable, holder=holder, waiting=lambda: not ticker.lost
                    )
        except DatabaseError as exc:
            raise StateWriteFailed("the budget check failed", transition="reserve") from exc
        if isinstance(verdict, budgets.Reservation):
            return verdict
        reason = TerminationReason.BUDGET_EXHAUSTED
        error = {"type": "BudgetExhausted", "message": verdict.message()}
        event = EventSpec(EventKind.BUDGET, verdict.payload())
        stop = self._settle(Status.FAILED, reason, error=error, events=[event])
        return stop or Stop.of(Outcome.FAILED, reason=reason)

    def _provider_failed(self, exc: ProviderError) -> Stop:
        error = provider_error(exc)
        verdict = retry_policy(
            exc, can_retry=self.retry is not None, requeue_count=self.run.requeue_count
        )
        if verdict.settle_reason is not None:
            events = settle_events(exc, error)
            stop = self._settle(Status.FAILED, verdict.settle_reason, error=error, events=events)
            return stop or Stop.of(Outcome.FAILED, reason=verdict.settle_reason)
        delay = float(verdict.retry_in_seconds or 0)
        requeued = transitions.run_requeue(
            self.lease,
            error=error,
            events=[
                EventSpec(
                    EventKind.LEASE,
                    {"action": "requeued", "retry_in_seconds": delay, "error": error},
                )
            ],
        )
        if not requeued:
            return self._lost()
        assert self.retry is not None  # retry_policy retries only with a scheduler
        self.retry(self.run, delay)
        return Stop.of(Outcome.REQUEUED, retry_in_seconds=delay)


def _priced(priced: budgets.Priced | None) -> dict[str, Any]:
    """What an ``llm`` event adds about cost: ``cost`` (a decimal string) when the configuration
    is priced, and ``usage_unknown`` when the provider reported no usage (charged 0)."""
    if priced is None:
        return {}
    return {"cost": str(priced.cost), **({} if priced.usage_known else {"usage_unknown": True})}
