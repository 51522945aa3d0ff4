"""In-doubt writes that settle themselves (docs/design.md §9.2): a tool's ``check`` asked whether a
call whose outcome is unknown landed, and its verdict applied like a person's.

A run parked in ``waiting_for_reconciliation`` (by the reaper after a dead segment, or by the
segment after ``OutcomeUnknown``) whose call's tool declares a check gets a django-q2 task
(``agentruns.tasks.check_in_doubt``). It runs the check with the tool timeout, read-only and
without a lease. *Landed* / *not landed* are recorded exactly as a person's verdict
(``transitions.locked_waiting_run`` then ``record_decision``: status and digest re-checked under
the row lock; queued for a worker), as a ``reconciliation`` event with ``by: "check"`` and the
check's evidence. *Unknown*, an error or a timeout is recorded on the card
(``pending_turn["check"]``) and as a ``check`` event, and retried with backoff until
``RECONCILE_CHECKS`` checks were made; then a person decides. A person may decide at any time:
whoever is first wins, once.

Never writes through the tool: the check runs in a read-only transaction (PostgreSQL) or with
``query_only`` on (SQLite); a write fails the check (an error).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from agentruns import transitions
from agentruns.conf import app_settings
from agentruns.exceptions import (
    AlreadyDecided,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    UnreadableState,
)
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status
from agentruns.services import decisions, dispatch
from agentruns.storable import KINDS, TEXT, NotJson, mend_json, storable_text
from agentruns.tools import CheckAnswer, CheckContext, registry
from agentruns.tools.invocation import MAX_RESULT_CHARS, MAX_RESULT_DEPTH
from agentruns.tools.registry import LANDED, MAX_EVIDENCE_CHARS
from agentruns.tools.shown import shown_turn
from agentruns.turns import (
    CheckStatus,
    PendingTurn,
    ReconciliationDecision,
)
from agentruns.turns.checks import (
    CHECKING,
    ERROR,
    REFUSED,
    RETRYING,
    SCHEDULED,
    TIMEOUT,
    UNKNOWN,
)

logger = logging.getLogger(__name__)

# What the task answers (django-q2 stores it as the task's result).
DECIDED_ELSEWHERE = "nothing to check"


class CheckTimedOut(Exception):
    """The check returned after its timeout."""


@contextlib.contextmanager
def read_only() -> Iterator[None]:
    """Run the body so that it cannot change the database: inside a caller's transaction a
    savepoint rolled back; on PostgreSQL a ``READ ONLY`` transaction rolled back; on SQLite
    ``PRAGMA query_only`` (no transaction: an IMMEDIATE one would take the write lock for as
    long as the check waits on the network)."""
    if connection.in_atomic_block or connection.vendor not in ("postgresql", "sqlite"):
        with transaction.atomic():
            yield
            transaction.set_rollback(True)
        return
    if connection.vendor == "postgresql":
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            yield
            transaction.set_rollback(True)
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA query_only = ON")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA query_only = OFF")


def _evidence(text: str) -> str:
    text = storable_text(text)
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[: MAX_EVIDENCE_CHARS - 1] + "…"


def ask(run: AgentRun, pending: PendingTurn, *, attempt: int) -> tuple[str, str, Any]:
    """Run the check of the call in doubt: ``(answer, evidence, result)`` where answer is
    ``landed``, ``not_landed``, ``unknown``, ``error`` or ``timeout``."""
    call = pending.call
    tool = registry.get(call.name) if call is not None else None
    if call is None or tool is None or tool.check is None:
        return ERROR, "the call's tool no longer declares a check", None
    timeout = app_settings().tool_timeout_seconds
    context = CheckContext(
        run_uuid=run.uuid,
        call_id=call.id,
        initiator_id=run.initiator_id,
        # The token the call was sent with (the lease it ran under), not the run's current one.
        fencing_token=pending.lease_epoch if pending.lease_epoch is not None else run.lease_epoch,
        timeout_seconds=timeout,
        name=call.name,
        arguments=dict(call.arguments) if isinstance(call.arguments, dict) else {},
        attempt=attempt,
    )
    started = time.monotonic()
    try:
        with read_only():
            answer = tool.check(context, dict(context.arguments))
        if time.monotonic() - started > timeout:
            raise CheckTimedOut(f"the check took longer than {timeout:g} s")
        if not isinstance(answer, CheckAnswer):
            raise TypeError(f"the check returned {type(answer).__name__}, not a CheckAnswer")
    except CheckTimedOut as exc:
        return TIMEOUT, str(exc), None
    except Exception as exc:
        logger.warning("run %s: the check of %s failed", run.uuid, call.name, exc_info=True)
        return ERROR, _evidence(f"{type(exc).__name__}: {_message(exc)}"), None
    return answer.verdict, answer.evidence, answer.result


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as inner:
        return f"(its message could not be read: {type(inner).__name__})"


def storable_answer(
    answer: str, evidence: str, result: Any
) -> tuple[str, str, Any, tuple[str, ...]]:
    """What ``ask`` found, as it may be stored, like a tool's result
    (``tools.invocation.stored_result``): the evidence and the result mended, with what was
    changed (``normalised``); a result JSON cannot hold makes the answer an ``error`` (its
    verdict is not taken: the next check, or a person, decides). Never raises."""
    cleaned = storable_text(evidence)
    marks = {TEXT} if cleaned is not evidence else set()
    try:
        mended = mend_json(result, max_chars=MAX_RESULT_CHARS, max_depth=MAX_RESULT_DEPTH)
    except NotJson as exc:
        problem = str(exc)
    except Exception as exc:  # a hostile value: its own code raised while it was read
        problem = f"reading it raised {type(exc).__name__}"
    else:
        marks.update(mended.normalised)
        return answer, cleaned, mended.value, tuple(kind for kind in KINDS if kind in marks)
    said = f"it answered {answer}, with a result JSON cannot hold: {problem}"
    return ERROR, _evidence(said), None, ()


def _backoff(attempt: int) -> float:
    return app_settings().retry_backoff_seconds * 2 ** (attempt - 1)


def _abandoned(check: CheckStatus, now: datetime) -> bool:
    """A check that started long enough ago that its worker must have died mid-check."""
    grace = app_settings().tool_timeout_seconds + app_settings().redispatch_seconds
    return check.started_at is None or check.started_at < now - timedelta(seconds=grace)


def _start(run_uuid: UUID | str, attempt: int) -> PendingTurn | None:
    """Mark ``attempt`` as running (a compare-and-set under the row lock: only the attempt due
    starts, or the same attempt again when the worker running it died long ago)."""
    now = timezone.now()
    with transitions.locked_check_turn(run_uuid) as locked:
        if locked is None:
            return None
        run, pending = locked
        started = _started(pending.check, attempt=attempt, now=now)
        return transitions.record_check(run, started) if started is not None else None


def _started(check: CheckStatus | None, *, attempt: int, now: datetime) -> CheckStatus | None:
    """The check status with ``attempt`` started, or ``None`` when it is not due."""
    if check is None or attempt > check.limit:
        return None
    due = check.state in (SCHEDULED, RETRYING) and check.attempts == attempt - 1
    died = check.state == CHECKING and check.attempts == attempt and _abandoned(check, now)
    return check.started(attempt=attempt, at=now) if due or died else None


def _note(
    run: AgentRun,
    pending: PendingTurn,
    *,
    attempt: int,
    answer: str,
    evidence: str,
    retry: bool,
    normalised: tuple[str, ...] = (),
) -> str:
    """Record an answer that settles nothing; schedule the next check when one is left."""
    now = timezone.now()
    delay = _backoff(attempt)
    next_at = now + timedelta(seconds=delay) if retry else None
    call = pending.call

    event = EventSpec(
        EventKind.CHECK,
        {
            "by": "check",
            "attempt": attempt,
            "answer": answer,
            "evidence": evidence,
            "call_id": call.id if call is not None else "",
            "name": call.name if call is not None else "",
            "next_at": next_at.isoformat() if next_at is not None else None,
            "left_to_person": next_at is None,
            **({"normalised": list(normalised)} if normalised else {}),
        },
    )
    with transitions.locked_check_turn(run.uuid, turn_digest=pending.turn_digest) as locked:
        check = locked[1].check if locked is not None else None
        if locked is None or check is None or check.attempts != attempt:
            return DECIDED_ELSEWHERE  # a person decided first, or another attempt runs
        answered = check.answered(answer=answer, evidence=evidence, at=now, next_at=next_at)
        transitions.record_check(locked[0], answered, [event])
        if next_at is not None:
            dispatch.check_after_commit(str(run.uuid), attempt=attempt + 1, delay_seconds=delay)
    return f"{answer}: " + ("retrying" if next_at is not None else "left to a person")


def _decide(
    run: AgentRun,
    pending: PendingTurn,
    *,
    attempt: int,
    verdict: str,
    evidence: str,
    result: Any,
    normalised: tuple[str, ...] = (),  # what was changed so the answer could be stored
) -> str:
    """Apply a verdict through the same guarded transition a person's uses, bound to the digest
    of the turn as a card shows it (``tools.shown.shown_turn``), as a person's is."""
    call = pending.call
    digest = shown_turn(run, pending).turn_digest
    landed_result = result if verdict == LANDED else None
    event = EventSpec(
        EventKind.RECONCILIATION,
        {
            "verdict": verdict,
            "by": "check",
            "evidence": evidence,
            "attempt": attempt,
            "turn_digest": digest,
            "call": call.to_json() if call is not None else None,
            "mode": "queued",
            "decider": None,
            "result": landed_result,
            **({"normalised": list(normalised)} if normalised else {}),
        },
    )
    with transitions.locked_waiting_run(
        run.uuid, expected_status=Status.WAITING_FOR_RECONCILIATION, turn_digest=digest
    ) as locked:
        decisions.runnable_without_tools(locked)
        decided = transitions.record_decision(
            locked,
            expected_status=Status.WAITING_FOR_RECONCILIATION,
            turn_digest=digest,
            decision=ReconciliationDecision(
                verdict=verdict, call=call, decider_id=None, by="check", result=landed_result
            ),
            event=event,
            identity=None,
        )
    decisions.hand_on(decided)
    return verdict


def run_check_in_doubt(*, run_uuid: UUID | str, attempt: int = 1) -> str:
    """Check attempt ``attempt`` of the in-doubt call of a run waiting for reconciliation.

    A no-op (``"nothing to check"``) when the run no longer waits on a check due now: a person
    decided, the run moved on, or this is a duplicate task. Returns what happened.
    """
    try:
        started = _start(run_uuid, attempt)
    except RunNotFound:
        return DECIDED_ELSEWHERE
    if started is None or started.check is None:
        return DECIDED_ELSEWHERE
    run = AgentRun.objects.get(uuid=run_uuid)
    answer, evidence, result, normalised = storable_answer(*ask(run, started, attempt=attempt))
    if answer in (LANDED, "not_landed"):
        try:
            return _decide(
                run,
                started,
                attempt=attempt,
                verdict=answer,
                evidence=evidence,
                result=result,
                normalised=normalised,
            )
        except (AlreadyDecided, NotWaiting, StaleTurn, RunNotFound):
            return DECIDED_ELSEWHERE  # a person was first
        except UnreadableState as exc:
            # The verdict cannot be taken (the configuration was deactivated, or the turn no
            # longer reads): the answer goes on the card and a person decides.
            return _note(
                run,
                started,
                attempt=attempt,
                answer=REFUSED,
                evidence=_evidence(f"it answered {answer} ({evidence}), but {exc.message}"),
                retry=False,
            )
    if answer not in (UNKNOWN, ERROR, TIMEOUT):  # pragma: no cover - ask() answers these only
        answer = ERROR
    return _note(
        run,
        started,
        attempt=attempt,
        answer=answer,
        evidence=evidence,
        retry=attempt < started.check.limit,
        normalised=normalised,
    )


def redispatch_due(*, limit: int = 500) -> int:
    """Send the check task again for runs whose check should have moved by now: scheduled or
    retrying, and due for ``REDISPATCH_SECONDS`` (its task was lost: the broker was down when it
    was sent); or checking for longer than the tool timeout and ``REDISPATCH_SECONDS`` (its
    worker died). Duplicates are harmless: an attempt starts once. Called by the reaper's pass;
    returns how many were sent."""
    now = timezone.now()
    slack = timedelta(seconds=app_settings().redispatch_seconds)
    candidates = AgentRun.objects.filter(
        status=Status.WAITING_FOR_RECONCILIATION,
        pending_turn__check__state__in=[SCHEDULED, RETRYING, CHECKING],
        updated_at__lt=now - slack,
    ).values_list("uuid", "pending_turn")[:limit]
    sent = 0
    for run_uuid, stored in candidates:
        check = CheckStatus.parse(stored.get("check") if isinstance(stored, dict) else None)
        if check is None:
            continue
        if check.state == CHECKING:
            if not _abandoned(check, now):
                continue
            attempt = check.attempts
        else:
            if check.next_at is not None and check.next_at > now - slack:
                continue
            attempt = check.attempts + 1
        try:
            dispatch.send_check(str(run_uuid), attempt=attempt)
        except Exception:
            logger.exception("reaper: could not resend the check of run %s", run_uuid)
            continue
        sent += 1
    return sent
