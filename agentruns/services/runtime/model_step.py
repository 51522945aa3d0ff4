"""The model's step of a segment: the budget check, the ``request`` boundary, the provider call
under the lease ticker, the ``llm`` event and the turn it proposes, and what a provider failure
does (docs/design.md §6, §7.1, §14)."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from django.db import DatabaseError

from agentruns import budgets, tracing
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec
from agentruns.models import EventKind, Status, TerminationReason
from agentruns.providers import Provider, ProviderError, ProviderReply
from agentruns.providers.base import ToolCall
from agentruns.providers.replies import check_reply
from agentruns.services.runtime import token_stream
from agentruns.services.runtime.boundaries import Boundaries
from agentruns.services.runtime.failures import provider_error, retry_policy, settle_events
from agentruns.services.runtime.results import Outcome, Stop
from agentruns.services.runtime.segment_state import Finished, Segment, SegmentState, Sent
from agentruns.services.runtime.ticker import LeaseTicker
from agentruns.services.runtime.transcript import unique_call_ids
from agentruns.services.runtime.turn_step import waits_for_approval
from agentruns.tools.gate import ToolGate
from agentruns.turns import Call, Turn


def ask_model(
    state: SegmentState, seg: Segment, writer: Boundaries, *, final: bool
) -> SegmentState | Finished | Stop:
    """One round's provider call (``final``: offered no tools). The state with the turn the
    answer proposes (saved with its ``llm`` event, or, when the turn waits for a decision,
    deferred to the suspend); ``Finished`` for a final answer (the settle records it)."""
    tools = [] if final else offered_tools(seg.gate)
    request, sent = _request(state, tools, final=final)
    reservation = check_budgets(state, seg, writer)
    if isinstance(reservation, Stop):
        return reservation
    if stop := writer.write(state, [request]):
        budgets.release(reservation)
        return stop
    state.sent = sent
    provider = seg.provider()
    started = time.monotonic()
    with LeaseTicker(seg.lease) as ticker, _traced_call(state, seg, final=final) as span:
        reply = _complete(provider, state, seg, tools)
        tracing.model_reply(span, reply)
    if isinstance(reply, ProviderError):
        budgets.release(reservation)
        if ticker.lost:
            return writer.lost(state, at="provider")
        return provider_failed(state, seg, writer, reply)
    duration_ms = int((time.monotonic() - started) * 1000)
    answered, calls = _answer(state, seg, reply, reservation, final=final, duration_ms=duration_ms)
    if ticker.lost:  # the ticker's renewal matched no row while the model answered
        return writer.lost(state, at="provider", completed=[answered])
    if final or not calls:
        return Finished(reply.content or "", answered, truncated=final)
    if waits_for_approval(state.loop.turn, seg.gate):
        # The turn waits for a decision: the answer (and the turn) is written by the write that
        # follows — the suspend, after the previews, or a refusal's boundary — as the final
        # answer is by the settle. Nothing runs in between but the previews (reads); a crash
        # there loses the answer as a crash inside the call would (it is asked again), and a
        # cancel noticed then records it (``Boundaries.lost``).
        writer.defer(state, answered)
        return state
    return writer.write(state, [answered]) or state


def offered_tools(gate: ToolGate) -> list[dict[str, Any]]:
    """The schemas of the tools offered to the model in a round that is not the final one."""
    return gate.offered()


def _traced_call(
    state: SegmentState, seg: Segment, *, final: bool
) -> AbstractContextManager[tracing.Traced]:
    """The provider call's span (``tracing.model_call``: the GenAI conventions)."""
    return tracing.model_call(
        provider=seg.config.provider,
        model=seg.config.model,
        max_tokens=seg.config.max_output_tokens,
        messages=state.messages,
        final=final,
    )


def _request(
    state: SegmentState, tools: list[dict[str, Any]], *, final: bool
) -> tuple[EventSpec, Sent]:
    """The ``request`` event of the call about to be made, and what it records as sent.

    What was sent, without storing the dialogue again: how many messages (the prompt, then the
    llm and tool events before this one); the system prompt and the tools offered on a
    segment's first request and when they change. A missing key means "as the previous
    request" (transcript.request_messages rebuilds it; docs/design.md §1.9)."""
    opening = state.messages[0] if state.messages else {}
    sent = Sent(
        system=opening.get("content") if opening.get("role") == "system" else None,
        tools=[t["function"]["name"] for t in tools],
    )
    last = state.sent
    payload: dict[str, Any] = {"iteration": state.loop.iteration, "final": final}
    if last is None or sent.system != last.system:
        payload["system"] = sent.system
    payload["message_count"] = len(state.messages)
    if last is None or sent.tools != last.tools:
        payload["tools"] = sent.tools
    event = EventSpec(EventKind.REQUEST, payload, shown={"messages": list(state.messages)})
    return event, sent


def _complete(
    provider: Provider, state: SegmentState, seg: Segment, tools: list[dict[str, Any]]
) -> ProviderReply | ProviderError:
    """The provider's reply, checked before anything of it is stored, shown or run
    (``providers.replies``), or its failure."""
    try:
        return check_reply(
            token_stream.ask(  # provider.complete, or streamed to a live view (§6.8)
                provider, messages=list(state.messages), tools=tools, run_uuid=str(seg.run.uuid)
            ),
            tokens_so_far=state.loop.usage.total_tokens,
        )
    except ProviderError as exc:
        return exc


def _answer(
    state: SegmentState,
    seg: Segment,
    reply: ProviderReply,
    reservation: budgets.Reservation | None,
    *,
    final: bool,
    duration_ms: int,
) -> tuple[EventSpec, list[ToolCall]]:
    """Count the answer into the state (a round, its usage, its cost and the charge the write
    recording it makes), take the turn it proposes; its ``llm`` event and the calls."""
    state.loop.iteration += 1
    state.loop.usage.add(reply.usage)
    priced = _charge(state, seg, reply, reservation)
    calls = [] if final else unique_call_ids(reply.tool_calls, state.messages, state.loop.iteration)
    if calls:
        # Each call keeps the effect its tool declares now (shown if the turn waits).
        state.loop.turn = Turn(
            calls=[
                Call(id=c.id, name=c.name, arguments=c.arguments, effect=seg.gate.effect(c.name))
                for c in calls
            ]
        )
    answered = EventSpec(
        EventKind.LLM,
        {
            "iteration": state.loop.iteration,
            "final": final,
            "content": reply.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
            "usage": dict(reply.usage),
            "model": reply.model,
            **({"normalised": list(reply.normalised)} if reply.normalised else {}),
            **_priced(priced),
        },
        duration_ms=duration_ms,
    )
    return answered, calls


def _charge(
    state: SegmentState,
    seg: Segment,
    reply: ProviderReply,
    reservation: budgets.Reservation | None,
) -> budgets.Priced | None:
    """The answer's price; when priced or budgeted, its cost added to the run's and its charge
    left for the write that records it (``Boundaries``)."""
    priced = budgets.call_cost(seg.config, reply.usage)
    if priced is not None or reservation is not None:
        cost = priced.cost if priced is not None else budgets.as_money(0)
        state.loop.usage.cost = budgets.as_money(state.loop.usage.cost + cost)
        state.unwritten.charge = budgets.Charge(
            configuration_id=seg.config.pk,
            initiator_id=seg.run.initiator_id,
            cost=cost,
            usage_known=priced is None or priced.usage_known,
            reservation=reservation,
        )
    return priced


def check_budgets(
    state: SegmentState, seg: Segment, writer: Boundaries
) -> budgets.Reservation | Stop | None:
    """The budget check before a provider call (``budgets.reserve``): ``None`` when no
    budget applies, the reservation when every budget admits the call, else the run is
    settled ``failed`` / ``budget_exhausted`` with a ``budget`` event and the model is not
    called. Refused while calls in flight hold the rest of a budget, it waits for them under
    the lease ticker, the deferred steps written first (a wait must not widen the gap in
    which a crash loses them); a lease lost meanwhile ends the wait and is found by the next
    write. A database error propagates (``StateWriteFailed``): no call without a check."""
    applicable = budgets.budgets_for(configuration=seg.config, initiator_id=seg.run.initiator_id)
    if not applicable:
        return None
    holder = budgets.Holder.of(seg.config, seg.lease)
    try:
        verdict = budgets.reserve(applicable, holder=holder, waiting=lambda: False)
        if isinstance(verdict, budgets.Exhausted) and not verdict.spent:
            if stop := writer.flush(state):
                return stop
            with LeaseTicker(seg.lease) as ticker:
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
    stop = writer.settle(state, Status.FAILED, reason, error=error, events=[event])
    return stop or Stop.of(Outcome.FAILED, reason=reason)


def provider_failed(
    state: SegmentState, seg: Segment, writer: Boundaries, exc: ProviderError
) -> Stop:
    """Settle or requeue after a provider failure (``failures.retry_policy``)."""
    error = provider_error(exc)
    verdict = retry_policy(
        exc, can_retry=seg.retry is not None, requeue_count=seg.run.requeue_count
    )
    if verdict.settle_reason is not None:
        events = settle_events(exc, error)
        stop = writer.settle(
            state, Status.FAILED, verdict.settle_reason, error=error, events=events
        )
        return stop or Stop.of(Outcome.FAILED, reason=verdict.settle_reason)
    delay = float(verdict.retry_in_seconds or 0)
    if stop := writer.requeue(state, error=error, delay=delay):
        return stop
    assert seg.retry is not None  # retry_policy retries only with a scheduler
    seg.retry(seg.run, delay)
    return Stop.of(Outcome.REQUEUED, retry_in_seconds=delay)


def _priced(priced: budgets.Priced | None) -> dict[str, Any]:
    """What an ``llm`` event adds about cost: ``cost`` (a decimal string) when the configuration
    is priced, and ``usage_unknown`` when the provider reported no usage (charged 0)."""
    if priced is None:
        return {}
    return {"cost": str(priced.cost), **({} if priced.usage_known else {"usage_unknown": True})}
