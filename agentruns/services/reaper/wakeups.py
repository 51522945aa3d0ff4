"""The reaper's wake-ups (docs/design.md §8.3, §8.4): sending those of a committed batch's
reclaimed runs (settling a run whose wake-up could not be sent), and redispatching queued runs
nobody claimed for ``REDISPATCH_SECONDS``.

Runs outside the batch's transaction: a wake-up is only sent for a change that committed.
"""

from __future__ import annotations

import logging

from django.db import transaction

from agentruns import selectors, transitions
from agentruns.conf import app_settings
from agentruns.identity import reaper_identity
from agentruns.leases import EventSpec
from agentruns.models import AgentRun, EventKind, Status, TerminationReason
from agentruns.services import dispatch
from agentruns.services.reaper.report import RunVerdict
from agentruns.services.reaper.rules import Rule, Verdict

# The reaper's one logger, named as before the package was split.
logger = logging.getLogger("agentruns.services.reaper")

#: At most this many unclaimed queued runs get a fresh wake-up per pass.
REDISPATCH_LIMIT = 500


def _send_wakeups(runs: list[AgentRun]) -> dict[int, str]:
    """Send the wake-ups of a committed batch; the error text of each one that failed.

    One transaction for the batch (with the ORM broker, ``dispatch.batched_wakeups`` writes the
    task rows in one INSERT). Should a send fail, that transaction is rolled back and the batch
    is sent again with a savepoint per send, so one failure does not undo the others (a wake-up
    that a non-transactional broker had already sent is then sent twice: claims decide, so the
    duplicate is harmless). If the commit itself fails, none was sent.
    """
    try:
        with transaction.atomic(), dispatch.batched_wakeups():
            for run in runs:
                dispatch.send_wakeup(str(run.uuid))
        return {}
    except Exception:
        logger.warning("reaper: a wake-up failed; sending the batch's one by one", exc_info=True)
    failures: dict[int, str] = {}
    try:
        with transaction.atomic():
            for run in runs:
                try:
                    with transaction.atomic():
                        dispatch.send_wakeup(str(run.uuid))
                except Exception as exc:
                    logger.exception("reaper: could not send the wake-up for run %s", run.uuid)
                    failures[run.pk] = f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:
        logger.exception("reaper: the batch of wake-ups could not be committed")
        failures = {run.pk: f"{type(exc).__name__}: {exc}"[:500] for run in runs}
    return failures


def _settle_unsent(run: AgentRun, verdict: RunVerdict, message: str, identity: str) -> RunVerdict:
    """A reclaimed run whose wake-up was not sent: settle it rather than leave it queued."""
    error = {"type": "DispatchFailed", "message": message}
    settled = transitions.run_settle_undispatched(
        run_id=run.pk,
        lease_epoch=run.lease_epoch,
        error=error,
        segment=identity,
        event=EventSpec(
            EventKind.REAPER,
            {
                "rule": Rule.RECLAIM,
                "verdict": Verdict.DEAD_LETTERED,
                "detail": "the wake-up could not be sent",
                "error": error,
            },
        ),
    )
    if not settled:  # a worker claimed it meanwhile (a duplicate task): it is not orphaned
        return verdict
    return RunVerdict(
        run_uuid=verdict.run_uuid,
        segment=verdict.segment,
        lease_epoch=verdict.lease_epoch,
        rule=Rule.RECLAIM,
        verdict=Verdict.DEAD_LETTERED,
        result=f"{Status.FAILED.value}/{TerminationReason.NOT_RETRYABLE.value}",
        detail="wake-up not sent: " + message,
    )


def redispatch_unclaimed(*, identity: str | None = None, limit: int = REDISPATCH_LIMIT) -> int:
    """Send a fresh wake-up to queued runs nobody claimed for ``REDISPATCH_SECONDS``.

    Claims decide, so a duplicate is harmless; each run is redispatched at most once per period
    (the guarded mark bumps ``updated_at``). Returns how many wake-ups were sent.
    """
    identity = identity or reaper_identity()
    seconds = app_settings().redispatch_seconds
    candidates = selectors.unclaimed_queued_runs(older_than_seconds=seconds).values_list(
        "pk", "uuid"
    )[:limit]
    sent = 0
    for run_id, run_uuid in list(candidates):
        marked = transitions.run_mark_redispatched(
            run_id=run_id,
            older_than_seconds=seconds,
            segment=identity,
            event=EventSpec(
                EventKind.REAPER,
                {"rule": "redispatch", "verdict": "redispatched", "unclaimed_for_s": seconds},
            ),
        )
        if not marked:
            continue
        try:
            with transaction.atomic():
                dispatch.send_wakeup(str(run_uuid))
        except Exception:
            logger.exception("reaper: could not redispatch run %s; next pass retries", run_uuid)
            continue
        sent += 1
    return sent
