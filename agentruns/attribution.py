"""Approval attribution (docs/design.md §5.6): who approved a run's writes, relative to who started
it.

Pure ranking logic over facts a selector gathered (``selectors.run_attributions`` fetches them
for a whole page in one query). Each approving decision is classified:

* ``self`` — the decider is the run's initiator;
* ``unresolved`` — the decision names no decider that can still be resolved (the account was
  deleted), so it cannot be told apart from a self-approval;
* ``initiator_unknown`` — the decider is known but the run has no initiator (a service caller,
  or the account was deleted);
* ``second_person`` — someone other than the initiator approved.

A run with several approved turns (several fences) shows the strongest, ranked
self > unresolved > initiator_unknown > second_person. Denials approve nothing and are not
attributed; a run without approvals has no attribution (``None``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db import models


class Attribution(models.TextChoices):
    SELF = "self", "self-approved"
    UNRESOLVED = "unresolved", "approver unresolved"
    INITIATOR_UNKNOWN = "initiator_unknown", "initiator unknown"
    SECOND_PERSON = "second_person", "approved by a second person"


# Strongest first.
RANKING: tuple[Attribution, ...] = (
    Attribution.SELF,
    Attribution.UNRESOLVED,
    Attribution.INITIATOR_UNKNOWN,
    Attribution.SECOND_PERSON,
)
_RANK = {attribution: position for position, attribution in enumerate(RANKING)}


def classify(*, initiator_id: int | None, decider_id: int | None) -> Attribution:
    """The attribution of one approving decision."""
    if decider_id is None:
        return Attribution.UNRESOLVED
    if initiator_id is None:
        return Attribution.INITIATOR_UNKNOWN
    if decider_id == initiator_id:
        return Attribution.SELF
    return Attribution.SECOND_PERSON


def strongest(attributions: Iterable[Attribution]) -> Attribution | None:
    """The strongest of several attributions; ``None`` for none."""
    return min(attributions, key=_RANK.__getitem__, default=None)


def attribute_runs(
    *,
    initiators: Mapping[int, int | None],
    deciders: Mapping[int, Iterable[int | None]],
) -> dict[int, Attribution | None]:
    """Per run id in ``initiators`` (run id → initiator id), the strongest attribution of the
    approving deciders listed for it in ``deciders`` (run id → decider ids)."""
    return {
        run_id: strongest(
            classify(initiator_id=initiator_id, decider_id=decider_id)
            for decider_id in deciders.get(run_id, ())
        )
        for run_id, initiator_id in initiators.items()
    }
