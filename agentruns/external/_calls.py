"""How a framework's call is known to its run: the call id Leasehold gives it, and what the run
recorded for it (docs/external.md). Private to ``agentruns.external``.

A framework's call is identified by its own id **and** the digest of its arguments as proposed:
the same pair proposed again (a replayed or forked LangGraph thread, a resumed Agents SDK run)
is the same call, whose recorded outcome is returned instead of running it again. The run keeps
which pairs it has seen in its loop state (``external_calls``: Leasehold call id → arguments
digest); the Leasehold id is the framework's, qualified with the digest when the framework used
an id before for other arguments. The tool's idempotency key is ``<run uuid>:<Leasehold id>``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentruns.exceptions import InvalidRequest
from agentruns.external.values import CallOutcome, ProposedCall
from agentruns.models import AgentRunEvent, EventKind
from agentruns.services.runtime.transcript import tool_message_content
from agentruns.storable import json_problem
from agentruns.tools.registry import UNPARSED_ARGUMENTS_KEY
from agentruns.turns import LoopState, canonical_json

#: The loop state's key for the calls an external loop proposed (``LoopState.extra``).
CALLS_KEY = "external_calls"
#: The longest call id a framework may give.
MAX_CALL_ID_CHARS = 128


def arguments_digest(arguments: Any) -> str:
    """The first 16 hex digits of the SHA-256 of the arguments' canonical JSON."""
    return hashlib.sha256(canonical_json(arguments).encode("utf-8")).hexdigest()[:16]


def checked(call: ProposedCall) -> ProposedCall:
    """``call`` as the run takes it, or ``InvalidRequest``: an id of 1 to 128 characters, a
    name, arguments JSON can store (anything but an object is kept as the unparsed text the
    tool refuses, as a provider's would be)."""
    if not isinstance(call.id, str) or not 0 < len(call.id) <= MAX_CALL_ID_CHARS:
        raise InvalidRequest(f"a call id is 1 to {MAX_CALL_ID_CHARS} characters", field="id")
    if not isinstance(call.name, str) or not call.name:
        raise InvalidRequest("a call names its tool", field="name")
    arguments: Any = call.arguments
    if not isinstance(arguments, dict):
        arguments = {UNPARSED_ARGUMENTS_KEY: str(arguments)}
    if (problem := json_problem(arguments)) is not None or (
        problem := json_problem(call.name)
    ) is not None:
        raise InvalidRequest(f"the call {call.id!r} cannot be stored: {problem}", field="arguments")
    return ProposedCall(call.id, call.name, dict(arguments))


def seen(loop: LoopState) -> dict[str, str]:
    """The run's proposed calls (Leasehold id → arguments digest), created when missing."""
    calls = loop.extra.get(CALLS_KEY)
    if not isinstance(calls, dict):
        calls = {}
        loop.extra[CALLS_KEY] = calls
    return calls


def leasehold_id(loop: LoopState, call: ProposedCall) -> tuple[str, bool]:
    """The Leasehold call id of ``call`` and whether the run has seen it before."""
    calls = seen(loop)
    digest = arguments_digest(call.arguments)
    if calls.get(call.id) == digest:
        return call.id, True
    qualified = f"{call.id}~{digest[:8]}"
    if calls.get(qualified) == digest:
        return qualified, True
    return (call.id if call.id not in calls else qualified), False


def remember(loop: LoopState, call_id: str, call: ProposedCall) -> None:
    seen(loop)[call_id] = arguments_digest(call.arguments)


def recorded_payload(run_id: int, call_id: str) -> dict[str, Any] | None:
    """The last ``tool`` event of ``call_id`` in the run's ledger (``None``: it never ran, was
    never denied, answered or reconciled)."""
    payload = (
        AgentRunEvent.objects.filter(run_id=run_id, kind=EventKind.TOOL, payload__call_id=call_id)
        .order_by("-sequence")
        .values_list("payload", flat=True)
        .first()
    )
    return payload if isinstance(payload, dict) else None


def outcome_of(
    payload: dict[str, Any], *, run_uuid: object, call_id: str, recorded: bool
) -> CallOutcome:
    """A ``tool`` event's payload as the framework reads it."""
    error = payload.get("error")
    reason = payload.get("reason")
    decided_by = payload.get("decided_by")
    return CallOutcome(
        call_id=call_id,
        name=str(payload.get("name") or ""),
        outcome=str(payload.get("outcome") or ""),
        ok=payload.get("ok") is True,
        result=payload.get("result"),
        error=error if isinstance(error, str) else "",
        message=tool_message_content(payload),
        idempotency_key=f"{run_uuid}:{call_id}",
        recorded=recorded,
        reason=reason if isinstance(reason, str) else "",
        decided_by=decided_by if isinstance(decided_by, str) else "",
    )
