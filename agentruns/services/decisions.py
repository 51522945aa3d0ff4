"""Decision services: approve or deny a pending turn, supply input, reconcile an in-doubt write.

Each takes keyword-only arguments, checks who may decide (``agentruns.authority``) and that the
decision may continue the run, and either hands the run on (inline or to a worker) or raises a
typed refusal before anything changed (docs/design.md §5, §9, §11.1).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from django.core.exceptions import ValidationError

from agentruns import tracing, transitions
from agentruns.authority import (
    DECIDE_PERMISSION,
    Authority,
    Decider,
    approval_authority,
    deciding_authority,
    escalation_of,
    self_approval,
)
from agentruns.exceptions import (
    ApprovalExpired,
    InvalidInput,
    InvalidRequest,
    NotPermitted,
    NotWaiting,
    RunNotFound,
    SelfApprovalRefused,
    StaleTurn,
    UnreadableState,
)
from agentruns.identity import execution_identity
from agentruns.leases import Decided, EventSpec
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    EventKind,
    Segment,
    Status,
)
from agentruns.services import dispatch
from agentruns.services._common import ClaimHook, User
from agentruns.services.call_decisions import (
    checked_reason,
    checked_verdicts,
    in_turn_order,
    require_call_authority,
    require_second_approver,
    require_valid_edits,
    verdicts_payload,
)
from agentruns.services.runtime.results import EventObserver, Outcome, SegmentResult
from agentruns.services.runtime.segment import continue_segment
from agentruns.tools import registry
from agentruns.tools.gate import ToolGate
from agentruns.tools.schemas import InvalidSchema, SchemaError, input_errors
from agentruns.tools.shown import shown_turn
from agentruns.transitions.deadlines import past_deadline
from agentruns.turns import (
    APPROVE,
    EDIT,
    ApprovalDecision,
    CallVerdict,
    InputDecision,
    PendingTurn,
    ReconciliationDecision,
    read_pending_turn,
)

logger = logging.getLogger(__name__)

RECONCILIATION_VERDICTS = ("landed", "not_landed", "abandon")


def _require_decider(actor: User) -> None:
    if not getattr(actor, "is_authenticated", False) or not actor.has_perm(DECIDE_PERMISSION):  # type: ignore[union-attr]
        raise NotPermitted("deciding needs the agentruns.decide_agentrun permission")


def _require_runnable(
    run: AgentRun, *, tools: bool, pending: PendingTurn | None = None
) -> AgentConfiguration:
    """Refuse (``UnreadableState``, with the reason) a decision that would continue ``run`` when
    its configuration was deactivated while it waited, or — ``tools``: the decision lets calls
    run — when a tool the turn shows as known is no longer registered. Cancel still works.
    Under the row lock (a decision's check); the configuration, read afresh; ``pending``: the
    locked row's pending turn, when the caller read it already."""
    # Read with the locked row, in the same statement (``transitions.deciding._lock_run``).
    configuration = run.configuration
    if not configuration.is_active:
        raise UnreadableState("its configuration was deactivated while it waited; cancel it")
    if tools:
        for call in (pending or read_pending_turn(run)).calls:
            if call.known and registry.get(call.name) is None:
                raise UnreadableState(f"tool {call.name!r} is no longer registered; cancel it")
    return configuration


def _not_expired(run: AgentRun) -> None:
    """Refuse (``ApprovalExpired``) a person's decision on a run whose approval deadline passed
    by the database clock (docs/design.md §5.11): the reaper settles it. Under the row lock, so
    of a decision and the deadline exactly one takes effect."""
    if past_deadline(run):
        raise ApprovalExpired()


def runnable_without_tools(run: AgentRun) -> None:
    """A reconciliation verdict's check (under the row lock): refuse when the configuration was
    deactivated while the run waited (``UnreadableState``). Also used by a tool's automatic
    check (``agentruns.services.reconciliation``)."""
    _require_runnable(run, tools=False)


def _four_eyes(actor: User, run: AgentRun, pending: PendingTurn) -> None:
    """Refuse (``SelfApprovalRefused``) an approval of the whole turn by the run's initiator, or
    by the person who edited one of its calls, when its configuration requires a second
    approver (read with the locked row; ``pending``, its pending turn)."""
    configuration = run.configuration
    if not configuration.require_second_approver:
        return
    if any(
        self_approval(
            actor_id=actor.pk,
            initiator_id=run.initiator_id,
            configuration=configuration,
            call=call,
        )
        for call in pending.calls
    ):
        raise SelfApprovalRefused()


def _require_authority(
    actor: User,
    run: AgentRun,
    configuration: AgentConfiguration,
    pending: PendingTurn | None = None,
) -> Authority:
    """Refuse (``NotPermitted``, naming what is missing) unless ``actor`` may approve the locked
    run's pending turn or give a landed / not landed verdict on it (docs/design.md §5.6).

    Runs under the row lock: the calls are read from the locked row; ``configuration`` (its
    approver group), the actor's permissions and group memberships afresh (``Decider.afresh``:
    not the permissions cached on ``actor`` when the decision started). ``pending``: the locked
    row's pending turn, when the caller read it already.
    """
    authority = approval_authority(
        user=Decider.afresh(actor),
        configuration=configuration,
        pending=pending or read_pending_turn(run),
        escalated_to=escalation_of(run),
    )
    if not authority.allowed:
        raise NotPermitted(authority.refusal)
    return authority


def _mode_identity(mode: str) -> str | None:
    if mode == "inline":
        return execution_identity(Segment.RESUME)
    if mode == "queued":
        return None
    raise InvalidRequest("mode must be 'inline' or 'queued'", field="mode")


def hand_on(
    decided: Decided,
    observer: EventObserver | None = None,
    on_claim: ClaimHook | None = None,
) -> SegmentResult:
    """Continue a run a decision took: inline under its new lease, or wake a worker."""
    _traced(decided.run, decided.event)
    if decided.lease is not None:
        if on_claim is not None:
            on_claim(decided.lease)
        if observer is not None and decided.event is not None:
            observer(decided.event)  # committed: a live trace shows the decision, then its steps
        # The row the decision locked and wrote, and the events it read, are handed on: not
        # read again.
        return continue_segment(
            decided.lease, observer=observer, run=decided.run, events=decided.events
        )
    if decided.run.status == Status.QUEUED:
        if not decided.run.external_framework:  # its own agent loop claims an external run
            dispatch.wake_after_commit(str(decided.run.uuid))
        return SegmentResult(Outcome.QUEUED, decided.run)
    return SegmentResult(Outcome.FAILED, decided.run)


def _traced(run: AgentRun, event: EventSpec | None) -> None:
    """The decision's span (``tracing.decision``), from the event that recorded it."""
    if event is not None:
        tracing.decision(run, kind=event.kind, payload=event.payload, actor_id=event.actor_id)


def run_decide(
    *,
    run_uuid: UUID | str,
    actor: User,
    turn_digest: str | None,
    approved: bool | None = None,
    verdicts: Sequence[CallVerdict] | None = None,
    reason: str = "",
    mode: str = "queued",
    observer: EventObserver | None = None,
    on_claim: ClaimHook | None = None,
) -> SegmentResult:
    """Decide the pending turn of a run waiting for approval: the whole turn (``approved``:
    every open call alike; a denial may carry the person's ``reason``) or each call
    (``verdicts``: every open call named once — approve, deny with an optional reason, answer
    in place of running it, or edit its arguments). Exactly one of the two.

    A decision holding an edit runs nothing: the denials and answers in it take effect, and the
    edited calls, with those approved beside them, wait on a new card (fresh digest, fresh
    previews) that someone approves as usual.

    Refusals (nothing changes): ``InvalidRequest``, ``ValueTooLong`` and ``CallsMismatch`` (the
    verdicts' shape; ``services.call_decisions``), ``NotPermitted`` (no ``decide_agentrun``;
    approving, answering or editing a call also needs its approve authority,
    ``agentruns.authority``, checked under the row lock; ``call_ids`` names the calls),
    ``InvalidArguments`` (an edit breaks the tool's schema), ``RunNotFound``, ``StaleTurn``
    (missing or stale digest), ``AlreadyDecided``, ``NotWaiting``, ``SelfApprovalRefused``
    (four-eyes: the initiator, or the person who edited a call, may not approve it),
    ``ApprovalExpired`` (its approval deadline passed: the reaper settles it). The approval
    event records every call's verdict and the authority checked. Inline mode continues under a
    ``resume:`` claim in this process; queued mode hands the continuation to a worker.
    """
    _require_decider(actor)
    identity = _mode_identity(mode)
    if (approved is None) == (verdicts is None):
        raise InvalidRequest("decide the whole turn or each call, not both", field="verdicts")
    if verdicts is not None:
        if reason:
            raise InvalidRequest("a per-call decision gives each denial its reason", field="reason")
        decided = _decide_per_call(
            run_uuid, actor, turn_digest, checked_verdicts(verdicts), mode, identity
        )
        return hand_on(decided, observer, on_claim)
    if not isinstance(approved, bool):
        raise InvalidRequest("approved must be true or false", field="approved")
    if reason and approved:
        raise InvalidRequest("a reason goes with a denial", field="reason")
    reason = checked_reason(reason, field="reason")

    with transitions.locked_waiting_run(
        run_uuid, expected_status=Status.WAITING_FOR_APPROVAL, turn_digest=turn_digest
    ) as run:
        _not_expired(run)
        pending = read_pending_turn(run)  # once: the checks and the event read the same turn
        configuration = _require_runnable(run, tools=approved, pending=pending)
        if approved:
            authority = _require_authority(actor, run, configuration, pending)
            _four_eyes(actor, run, pending)
        else:
            authority = deciding_authority(actor)
        decided = transitions.record_decision(
            run,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=turn_digest,
            decision=ApprovalDecision(
                approved=approved,
                decider_id=actor.pk,
                turn_digest=turn_digest or "",
                # A denial's words for the model: who denied, and why.
                decider="" if approved else actor.get_username(),
                reason=reason,
            ),
            # Built under the row lock, from the turn the digest was checked against.
            event=EventSpec(
                EventKind.APPROVAL,
                {
                    "approved": approved,
                    "turn_digest": turn_digest,
                    "mode": mode,
                    "decider": actor.get_username(),
                    "calls": [{"id": c.id, "name": c.name} for c in pending.calls],
                    "authority": authority.as_payload(),
                    **({"reason": reason} if reason else {}),
                },
                actor_id=actor.pk,
            ),
            identity=identity,
        )
    return hand_on(decided, observer, on_claim)


def _decide_per_call(
    run_uuid: UUID | str,
    actor: User,
    turn_digest: str | None,
    verdicts: tuple[CallVerdict, ...],
    mode: str,
    identity: str | None,
) -> Decided:
    """``run_decide`` per call: lock, check in order, record (``services.call_decisions``)."""
    with transitions.locked_waiting_run(
        run_uuid, expected_status=Status.WAITING_FOR_APPROVAL, turn_digest=turn_digest
    ) as run:
        _not_expired(run)
        pending = read_pending_turn(run)  # once: the checks and the event read the same turn
        calls = pending.calls
        verdicts = in_turn_order(verdicts, calls)
        runs_tools = any(v.verdict in (APPROVE, EDIT) for v in verdicts)
        configuration = _require_runnable(run, tools=runs_tools, pending=pending)
        require_valid_edits(run, verdicts, calls)
        authority = require_call_authority(actor, run, configuration, verdicts, calls)
        require_second_approver(actor, run, verdicts, calls)
        approved = any(v.verdict == APPROVE for v in verdicts)
        edited = any(v.verdict == EDIT for v in verdicts)
        return transitions.record_decision(
            run,
            expected_status=Status.WAITING_FOR_APPROVAL,
            turn_digest=turn_digest,
            decision=ApprovalDecision(
                approved=approved,
                decider_id=actor.pk,
                turn_digest=turn_digest or "",
                verdicts=verdicts,
                decider=actor.get_username(),
            ),
            event=EventSpec(
                EventKind.APPROVAL,
                {
                    "approved": approved,
                    "per_call": True,
                    "turn_digest": turn_digest,
                    "mode": mode,
                    "decider": actor.get_username(),
                    "calls": verdicts_payload(verdicts, calls),
                    "authority": authority.as_payload(),
                    **({"editor": actor.get_username()} if edited else {}),
                },
                actor_id=actor.pk,
            ),
            identity=identity,
        )


def edit_schema(*, run: AgentRun, call_id: str) -> dict[str, Any] | None:
    """The JSON schema an edit of the call ``call_id`` of ``run``'s pending turn must meet (its
    tool's ``parameters``, as the run's gate resolves the tool now); ``None`` when the run has
    no such call or its tool is not available to the run (offer no edit)."""
    pending = read_pending_turn(run)
    call = next((c for c in pending.calls if c.id == call_id), None)
    tool = ToolGate.of(run).available(call.name) if call is not None else None
    return dict(tool.parameters) if tool is not None else None


def _pending(run_uuid: UUID | str, *, waiting_in: str) -> PendingTurn | None:
    """The pending turn of a run waiting in ``waiting_in``, as a card shows it
    (``tools.shown.shown_turn``: its digest is the one a card sends); ``None`` when the run is
    in another status (the transition, under the lock, says why: already decided or not
    waiting).

    Raises ``RunNotFound``, or ``UnreadableState`` when it waits but its stored turn does not
    read (checked again under the lock).
    """
    try:
        run = (
            AgentRun.objects.filter(uuid=run_uuid)
            .select_related("configuration")
            .only("uuid", "status", "pending_turn", "request", "configuration__tools")
            .first()
        )
    except (ValidationError, ValueError):
        raise RunNotFound() from None
    if run is None:
        raise RunNotFound()
    if run.status != waiting_in:
        return None
    pending = read_pending_turn(run)
    if not pending.readable:
        raise UnreadableState(f"its pending turn cannot be read: {pending.problem}")
    return shown_turn(run, pending)


def validate_values(schema: dict[str, Any], values: Any) -> list[SchemaError]:
    """Validate human-supplied values against an input schema (``input_errors``: structured,
    sorted, capped); empty if valid. ``UnreadableState`` when the schema cannot be applied (a
    reference that does not resolve): no value could ever be accepted."""
    try:
        return input_errors(schema, values)
    except InvalidSchema as exc:
        raise UnreadableState(f"its input schema cannot be used: {exc}") from None


def run_submit_input(
    *,
    run_uuid: UUID | str,
    actor: User,
    values: Any,
    turn_digest: str | None,
    mode: str = "queued",
    observer: EventObserver | None = None,
    on_claim: ClaimHook | None = None,
) -> SegmentResult:
    """Supply the typed values a tool asked a human for.

    The values are validated against the pending input schema before anything is claimed
    (``InvalidInput``, 422, with ``errors``); the digest binds them to that schema. A schema
    that cannot be used is ``UnreadableState`` (409): unreadable when read, or refused here.
    """
    _require_decider(actor)
    identity = _mode_identity(mode)
    pending = _pending(run_uuid, waiting_in=Status.WAITING_FOR_INPUT)
    if pending is None:
        raise NotWaiting()
    if not turn_digest or pending.turn_digest != turn_digest:
        # Checked again under the lock; refusing here avoids validating against the wrong schema.
        raise StaleTurn()
    errors = validate_values(pending.input_schema or {}, values)
    if errors:
        raise InvalidInput(errors=errors)
    call = pending.call
    assert call is not None  # an input turn has its call
    with transitions.locked_waiting_run(
        run_uuid, expected_status=Status.WAITING_FOR_INPUT, turn_digest=turn_digest
    ) as run:
        _not_expired(run)
        _require_runnable(run, tools=True)
        decided = transitions.record_decision(
            run,
            expected_status=Status.WAITING_FOR_INPUT,
            turn_digest=turn_digest,
            decision=InputDecision(
                call_id=call.id, values=values, decider_id=actor.pk, turn_digest=turn_digest
            ),
            event=EventSpec(
                EventKind.INPUT,
                {
                    "call_id": call.id,
                    "name": call.name,
                    "values": values,
                    "turn_digest": turn_digest,
                    "mode": mode,
                    "decider": actor.get_username(),
                },
                actor_id=actor.pk,
            ),
            identity=identity,
        )
    return hand_on(decided, observer, on_claim)


def run_reconcile(
    *,
    run_uuid: UUID | str,
    actor: User,
    verdict: str,
    turn_digest: str | None,
    mode: str = "queued",
    observer: EventObserver | None = None,
    on_claim: ClaimHook | None = None,
) -> SegmentResult:
    """Resolve an in-doubt write (docs/design.md §9): ``landed``, ``not_landed`` or ``abandon``.

    Every verdict needs ``decide_agentrun``; ``landed`` and ``not_landed`` also need the
    authority to approve the call in doubt (``agentruns.authority``), checked under the row
    lock; ``abandon`` needs no more. The event records the authority checked.
    """
    _require_decider(actor)
    if verdict not in RECONCILIATION_VERDICTS:
        raise InvalidRequest(
            f"verdict must be one of {', '.join(RECONCILIATION_VERDICTS)}", field="verdict"
        )
    identity = _mode_identity(mode)
    pending = _pending(run_uuid, waiting_in=Status.WAITING_FOR_RECONCILIATION)
    call = pending.call if pending is not None else None

    def event(authority: Authority) -> EventSpec:
        return EventSpec(
            EventKind.RECONCILIATION,
            {
                "verdict": verdict,
                "turn_digest": turn_digest,
                "call": call.to_json() if call is not None else None,
                "mode": mode,
                "decider": actor.get_username(),
                "by": "person",
                "authority": authority.as_payload(),
            },
            actor_id=actor.pk,
        )

    with transitions.locked_waiting_run(
        run_uuid, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=turn_digest
    ) as run:
        if verdict == "abandon":
            abandon = event(deciding_authority(actor))
            abandoned = transitions.record_abandon(run, turn_digest=turn_digest, event=abandon)
            _traced(abandoned, abandon)
            return SegmentResult(Outcome.FAILED, abandoned)
        authority = _require_authority(actor, run, _require_runnable(run, tools=False))
        decided = transitions.record_decision(
            run,
            expected_status=Status.WAITING_FOR_RECONCILIATION,
            turn_digest=turn_digest,
            decision=ReconciliationDecision(verdict=verdict, call=call, decider_id=actor.pk),
            event=event(authority),
            identity=identity,
        )
    return hand_on(decided, observer, on_claim)
