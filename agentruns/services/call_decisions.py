"""The checks of a decision per call (docs/design.md §5): plain functions the decision service
(``agentruns.services.decisions.run_decide``) runs in order — the verdicts' shape before the row
lock, the rest on the locked row.

Before the lock, nothing read: each verdict known, a reason and an answer within their bounds,
an answer or edited arguments JSON that every column stores and no deeper than
``MAX_VERDICT_DEPTH``, no call named twice (``InvalidRequest``, ``ValueTooLong``,
``CallsMismatch``). Under the lock, from the locked row: every open call named exactly once
(``CallsMismatch``), each edit valid for its tool's schema (``InvalidArguments``), the approve
authority of every call approved, answered or edited (``NotPermitted``) and four-eyes on every
call approved (``SelfApprovalRefused``). Raises; writes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentruns.authority import (
    Authority,
    Decider,
    User,
    call_authority,
    deciding_authority,
    escalation_of,
    self_approval,
)
from agentruns.exceptions import (
    CallsMismatch,
    InvalidArguments,
    InvalidRequest,
    NotPermitted,
    SelfApprovalRefused,
    UnreadableState,
    ValueTooLong,
)
from agentruns.models import AgentConfiguration, AgentRun
from agentruns.storable import json_problem, text_problem
from agentruns.tools.gate import ToolGate
from agentruns.tools.schemas import InvalidSchema, input_errors
from agentruns.turns import (
    ANSWER,
    APPROVE,
    DENY,
    EDIT,
    MAX_ANSWER_CHARS,
    MAX_REASON_CHARS,
    MAX_VERDICT_DEPTH,
    VERDICTS,
    Call,
    CallVerdict,
    canonical_json,
)
from agentruns.turns.call_verdicts import answer_chars


def checked_reason(reason: object, *, field: str) -> str:
    """A reason as a person gave it: text, storable, at most ``MAX_REASON_CHARS`` characters
    (kept verbatim: the model reads it as the reviewer's words)."""
    if not isinstance(reason, str):
        raise InvalidRequest("a reason is text", field=field)
    if len(reason) > MAX_REASON_CHARS:
        raise ValueTooLong(
            f"a reason is at most {MAX_REASON_CHARS:,} characters",
            field=field,
            limit=MAX_REASON_CHARS,
        )
    problem = text_problem(reason)
    if problem is not None:
        raise InvalidRequest(f"the reason holds {problem}", field=field)
    return reason


def _checked_json(value: Any, *, field: str, what: str) -> None:
    problem = json_problem(value, max_depth=MAX_VERDICT_DEPTH)
    if problem is not None:
        raise InvalidRequest(f"{what}: {problem}", field=field)


def _checked_answer(answer: Any, *, field: str) -> None:
    if answer is None:
        raise InvalidRequest("an answer needs a value (a JSON value or text)", field=field)
    _checked_json(answer, field=field, what="the answer")
    if answer_chars(answer) > MAX_ANSWER_CHARS:
        raise ValueTooLong(
            f"an answer is at most {MAX_ANSWER_CHARS:,} characters",
            field=field,
            limit=MAX_ANSWER_CHARS,
        )


def _checked_arguments(arguments: Any, *, field: str) -> None:
    if not isinstance(arguments, dict):
        raise InvalidRequest("edited arguments are a JSON object", field=field)
    _checked_json(arguments, field=field, what="the arguments")
    if len(canonical_json(arguments)) > MAX_ANSWER_CHARS:
        raise ValueTooLong(
            f"edited arguments are at most {MAX_ANSWER_CHARS:,} characters of JSON",
            field=field,
            limit=MAX_ANSWER_CHARS,
        )


def checked_verdicts(verdicts: object) -> tuple[CallVerdict, ...]:
    """The verdicts of a decision per call, checked for shape (nothing read): a non-empty list
    of ``CallVerdict``; each verdict known; a reason only with a denial; an answer with an
    ``answer``; arguments with an ``edit``; no call named twice."""
    if not isinstance(verdicts, list | tuple) or not verdicts:
        raise InvalidRequest("name every open call of the turn", field="calls")
    for index, verdict in enumerate(verdicts):
        where = f"calls[{index}]"
        if not isinstance(verdict, CallVerdict) or not isinstance(verdict.call_id, str):
            raise InvalidRequest("a verdict names a call id", field=f"{where}.id")
        if verdict.verdict not in VERDICTS:
            raise InvalidRequest(
                f"a verdict is one of {', '.join(VERDICTS)}", field=f"{where}.verdict"
            )
        if verdict.reason and verdict.verdict != DENY:
            raise InvalidRequest("a reason goes with a denial", field=f"{where}.reason")
        checked_reason(verdict.reason, field=f"{where}.reason")
        if verdict.verdict == ANSWER:
            _checked_answer(verdict.answer, field=f"{where}.answer")
        elif verdict.answer is not None:
            raise InvalidRequest("an answer goes with the verdict answer", field=f"{where}.answer")
        if verdict.verdict == EDIT:
            _checked_arguments(verdict.arguments, field=f"{where}.arguments")
        elif verdict.arguments is not None:
            raise InvalidRequest("arguments go with the verdict edit", field=f"{where}.arguments")
    counts = Counter(verdict.call_id for verdict in verdicts)
    duplicated = [call_id for call_id, count in counts.items() if count > 1]
    if duplicated:
        raise CallsMismatch(duplicated=duplicated)
    return tuple(verdicts)


def in_turn_order(
    verdicts: Sequence[CallVerdict], calls: Sequence[Call]
) -> tuple[CallVerdict, ...]:
    """``verdicts`` in the order of the open ``calls`` (the locked pending turn's), each call
    named exactly once (``CallsMismatch`` naming what is missing or not open)."""
    named = {verdict.call_id: verdict for verdict in verdicts}
    open_ids = [call.id for call in calls]
    missing = [call_id for call_id in open_ids if call_id not in named]
    unknown = [call_id for call_id in named if call_id not in open_ids]
    if missing or unknown:
        raise CallsMismatch(missing=missing, unknown=unknown)
    return tuple(named[call_id] for call_id in open_ids)


def require_valid_edits(
    run: AgentRun, verdicts: Sequence[CallVerdict], calls: Sequence[Call]
) -> None:
    """Refuse (``InvalidArguments``, naming the call and the field) an edit whose arguments
    break its tool's schema, as the run's gate resolves the tool now; a tool not available to
    the run cannot be edited for."""
    gate = ToolGate.of(run)
    by_id = {call.id: call for call in calls}
    for verdict in verdicts:
        if verdict.verdict != EDIT:
            continue
        call = by_id[verdict.call_id]
        tool = gate.available(call.name)
        if tool is None:
            raise UnreadableState(f"tool {call.name!r} is not available to this run: no edit")
        try:
            errors = input_errors(tool.parameters, verdict.arguments)
        except InvalidSchema as exc:
            raise UnreadableState(f"the schema of {call.name!r} cannot be used: {exc}") from None
        if errors:
            raise InvalidArguments(
                f"the edited arguments of {call.id} do not match {call.name}'s schema",
                call_id=call.id,
                errors=errors,
            )


def require_call_authority(
    actor: User,
    run: AgentRun,
    configuration: AgentConfiguration,
    verdicts: Sequence[CallVerdict],
    calls: Sequence[Call],
) -> Authority:
    """Refuse (``NotPermitted``, naming the calls and what is missing) unless ``actor`` — read
    afresh, once — holds the approve authority of every call approved, answered or edited
    (``authority.call_authority``; the group the locked ``run``'s wait was escalated to counts
    as its approver group); a denial needs deciding only. Returns what was checked (the
    permissions of those calls, the approver group) for the decision's event."""
    decider = Decider.afresh(actor)
    escalated_to = escalation_of(run)
    by_id = {call.id: call for call in calls}
    permissions: list[str] = []
    group: str | None = None
    refused: list[str] = []
    missing: list[str] = []
    for verdict in verdicts:
        authority = (
            call_authority(
                user=decider,
                configuration=configuration,
                call=by_id[verdict.call_id],
                escalated_to=escalated_to,
            )
            if verdict.needs_approve_authority
            else deciding_authority(decider)
        )
        permissions.extend(authority.permissions)
        group = group or authority.group
        if not authority.allowed:
            refused.append(verdict.call_id)
            missing.extend(authority.missing)
    if refused:
        raise NotPermitted("; ".join(dict.fromkeys(missing)), call_ids=refused)
    return Authority(permissions=tuple(dict.fromkeys(permissions)), group=group)


def require_second_approver(
    actor: User, run: AgentRun, verdicts: Sequence[CallVerdict], calls: Sequence[Call]
) -> None:
    """Four-eyes per call: refuse (``SelfApprovalRefused``, naming the calls) an approval of a
    call by the run's initiator or by the person who edited its arguments, when the run's
    configuration requires a second approver (``authority.self_approval``)."""
    by_id = {call.id: call for call in calls}
    own = [
        verdict.call_id
        for verdict in verdicts
        if verdict.verdict == APPROVE
        and self_approval(
            actor_id=actor.pk,
            initiator_id=run.initiator_id,
            configuration=run.configuration,
            call=by_id[verdict.call_id],
        )
    ]
    if own:
        raise SelfApprovalRefused(call_ids=own)


def verdicts_payload(
    verdicts: Sequence[CallVerdict], calls: Sequence[Call]
) -> list[dict[str, Any]]:
    """Every call's verdict as the ``approval`` event lists it: id, name, verdict, and the
    reason, the answer or the edited arguments with the model's original ones."""
    by_id = {call.id: call for call in calls}
    listed = []
    for verdict in verdicts:
        call = by_id[verdict.call_id]
        entry: dict[str, Any] = {"id": call.id, "name": call.name, **verdict.to_json()}
        if verdict.verdict == EDIT:
            original = call.edit.original_arguments if call.edit is not None else call.arguments
            entry["original_arguments"] = original
        listed.append(entry)
    return listed
