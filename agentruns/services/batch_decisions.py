"""Deciding several runs at once: a reviewer's selection in the inbox, approved or denied.

Each selected run is decided on its own by ``agentruns.services.decisions.run_decide``, bound to
the digest of the card the reviewer selected and checked against that run's own authority, in
its own transaction: a refusal of one run changes nothing of it and nothing of the others. The
result names, per run, what happened (docs/design.md §5).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from uuid import UUID

from agentruns.exceptions import AlreadyDecided, InvalidRequest, LeaseholdError
from agentruns.services._common import User
from agentruns.services.decisions import run_decide
from agentruns.services.runtime.results import SegmentResult

logger = logging.getLogger(__name__)

# A selection is one page of cards at most (the inbox shows 20): more is a malformed request.
MAX_SELECTED: Final = 100

APPROVED: Final = "approved"
DENIED: Final = "denied"
ALREADY_DECIDED: Final = "already_decided"
REFUSED: Final = "refused"


@dataclass(frozen=True)
class Selected:
    """One card of a selection: the run and the digest of the turn its card showed."""

    run_uuid: UUID
    turn_digest: str


@dataclass(frozen=True)
class BatchOutcome:
    """What became of one selected run: ``outcome`` is ``approved`` or ``denied`` (``result``
    says how the run goes on), ``already_decided`` (someone decided this turn first) or
    ``refused`` (``refusal`` says why; nothing of this run changed)."""

    run_uuid: UUID
    outcome: str
    result: SegmentResult | None = None
    refusal: LeaseholdError | None = None

    @property
    def decided(self) -> bool:
        return self.outcome in (APPROVED, DENIED)


def runs_decide_batch(
    *,
    selections: Sequence[Selected],
    actor: User,
    approved: bool,
    mode: str = "queued",
) -> list[BatchOutcome]:
    """Approve (``approved``) or deny every selected run, one ``run_decide`` each, in the order
    selected; one ``BatchOutcome`` per distinct run (a run selected twice is decided once).

    Every refusal ``run_decide`` knows (``StaleTurn``, ``NotPermitted``, ``SelfApprovalRefused``,
    ``ApprovalExpired``, ``NotWaiting``, ``RunNotFound``, ``UnreadableState`` …) is that run's
    outcome, not the batch's: the other runs are decided regardless. ``AlreadyDecided`` is its
    own outcome. ``InvalidRequest`` (nothing decided) for an empty selection or one of more than
    ``MAX_SELECTED`` runs.
    """
    if not isinstance(approved, bool):
        raise InvalidRequest("approved must be true or false", field="approved")
    first: dict[UUID, Selected] = {}
    for selected in selections:
        first.setdefault(selected.run_uuid, selected)
    distinct = list(first.values())
    if not distinct:
        raise InvalidRequest("select at least one run", field="selected")
    if len(distinct) > MAX_SELECTED:
        raise InvalidRequest(f"select at most {MAX_SELECTED} runs at once", field="selected")
    return [_decide_one(s, actor=actor, approved=approved, mode=mode) for s in distinct]


def _decide_one(selected: Selected, *, actor: User, approved: bool, mode: str) -> BatchOutcome:
    try:
        result = run_decide(
            run_uuid=selected.run_uuid,
            actor=actor,
            approved=approved,
            turn_digest=selected.turn_digest or None,
            mode=mode,
        )
    except AlreadyDecided as exc:
        return BatchOutcome(selected.run_uuid, ALREADY_DECIDED, refusal=exc)
    except LeaseholdError as exc:
        logger.info("batch decision on run %s refused: %s", selected.run_uuid, exc.code)
        return BatchOutcome(selected.run_uuid, REFUSED, refusal=exc)
    return BatchOutcome(selected.run_uuid, APPROVED if approved else DENIED, result=result)
