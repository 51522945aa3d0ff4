"""What a segment does when its provider fails, and the totals it settles with
(docs/design.md §7).

A provider failure is settled or retried by one policy, ``retry_policy``: a reply that was
refused (``bad_response``: not a completion, or holding what cannot be stored or run,
``providers.replies``) settles ``bad_response`` at once, with an ``error`` event saying why;
otherwise, without a retry scheduler (an interactive segment) it settles ``provider_failed``; a
failure the provider marks not retryable settles ``not_retryable``; a spent budget
``retries_exhausted``; otherwise the run is requeued with an exponential backoff.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from agentruns import transitions
from agentruns.conf import app_settings
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.providers.base import ErrorKind, ProviderError
from agentruns.services.runtime.results import Outcome, Stop
from agentruns.storable import storable_text
from agentruns.turns import LoopState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryVerdict:
    """Either ``settle_reason`` (end the run ``failed`` with it) or ``retry_in_seconds``."""

    settle_reason: str | None = None
    retry_in_seconds: float | None = None


def provider_error(exc: ProviderError) -> dict[str, Any]:
    """The ``error`` recorded for a provider failure: the message bounded, and storable whatever
    a remote server put in it (``storable_text``)."""
    return {"type": f"ProviderError:{exc.kind}", "message": storable_text(str(exc)[:500])}


def retry_policy(exc: ProviderError, *, can_retry: bool, requeue_count: int) -> RetryVerdict:
    """Settle or retry a provider failure (see the module docstring)."""
    if exc.kind == ErrorKind.BAD_RESPONSE:
        return RetryVerdict(settle_reason=TerminationReason.BAD_RESPONSE)
    if not can_retry:
        return RetryVerdict(settle_reason=TerminationReason.PROVIDER_FAILED)
    if not exc.retryable:
        return RetryVerdict(settle_reason=TerminationReason.NOT_RETRYABLE)
    if requeue_count >= app_settings().max_requeues:
        return RetryVerdict(settle_reason=TerminationReason.RETRIES_EXHAUSTED)
    delay = app_settings().retry_backoff_seconds * (2**requeue_count)
    return RetryVerdict(retry_in_seconds=delay)


def settle_events(exc: ProviderError, error: dict[str, Any]) -> list[EventSpec]:
    """The events a provider failure's settle appends: an ``error`` event for a refused reply
    (the reply itself is not recorded, so the event says what was wrong with it)."""
    if exc.kind != ErrorKind.BAD_RESPONSE:
        return []
    return [EventSpec(EventKind.ERROR, dict(error))]


def totals(state: LoopState, *, truncated: bool) -> dict[str, Any]:
    """The run's columns a settle writes from the loop state: tokens, rounds, the state itself."""
    return {
        "prompt_tokens": state.usage.prompt_tokens,
        "completion_tokens": state.usage.completion_tokens,
        "total_tokens": state.usage.total_tokens,
        "cost": state.usage.cost,
        "iterations": state.iteration,
        "truncated": truncated,
        "loop_state": state.to_json(),
    }


def settle_internal_error(lease: Lease, state: LoopState, exc: Exception) -> Stop:
    """After an unexpected exception in a segment (a bug, a raising observer, a registry error):
    log it, record an ``error`` event (type and message) and settle the run ``failed`` /
    ``internal_error`` under ``lease`` — unless a write is fenced, where the reaper's fence rule
    decides as for a dead segment (docs/design.md §7.3). What the failed step left unwritten is
    not recorded."""
    logger.exception("run %s: unexpected error in the segment", lease.uuid)
    error = {"type": type(exc).__name__, "message": storable_text(str(exc)[:500])}
    fenced = (
        AgentRun.objects.filter(pk=lease.run_id).values_list("pending_effect", flat=True).first()
    )
    if fenced:
        return Stop.of(Outcome.FAILED, error="internal_error", fenced=fenced)
    try:
        settled = transitions.run_settle(
            run_id=lease.run_id,
            lease=lease,
            status=Status.FAILED,
            reason=TerminationReason.INTERNAL_ERROR,
            error=error,
            totals=totals(state, truncated=False),
            events=[EventSpec(EventKind.ERROR, dict(error))],
        )
    except StateWriteFailed:
        logger.error("run %s: could not settle after an internal error", lease.uuid)
        settled = False
    if not settled:  # lost or cancelled meanwhile: the first outcome stands
        return Stop.of(Outcome.FAILED, error="internal_error")
    return Stop.of(Outcome.FAILED, reason=TerminationReason.INTERNAL_ERROR)
