"""A card: one waiting run as the inbox shows it — its pending turn read by ``agentruns.turns``
and shown by ``agentruns.tools.shown`` (each call's tool as it stands now: the digest the card
sends covers exactly what it shows), what its reader may decide on it (``agentruns.authority``)
and, for input, the form generated from the schema. The authority reads the reader's groups once
per ``Decider``, and the configuration (with its approver group) comes joined with the run; a
remote tool's origin reads its server row."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentruns.authority import (
    Authority,
    Decider,
    approval_authority,
    cancel_authority,
    escalation_of,
)
from agentruns.input_forms import InputSpec, InputValuesForm, input_form_for
from agentruns.models import DEADLINE_STATUSES, AgentRun, Status
from agentruns.tools.shown import shown_turn
from agentruns.turns import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    PendingTurn,
    read_pending_turn,
    waits_for_a_human,
)
from agentruns.verdict_forms import CallForm, approves_all, turn_call_forms


@dataclass
class Card:
    run: AgentRun
    pending: PendingTurn
    spec: InputSpec | None = None
    form: InputValuesForm | None = None
    # The posted digest differed from the turn shown now (input re-rendered after a change).
    changed: bool = False
    # Shown open in the inbox's one-line view (an input form coming back with its errors).
    opened: bool = False
    # Approval and reconciliation cards: whether the reader may approve / say it landed, and
    # what they lack if not (they may still deny / abandon).
    authority: Authority | None = None
    # Whether the reader may cancel the run (*Cancel run*), and what they lack if not.
    cancel: Authority | None = None
    # Approval cards: each call's verdict form (what the reader may give it), model order.
    call_forms: list[CallForm] = field(default_factory=list)

    @property
    def approve_all(self) -> bool:
        """Whether *Approve all* is offered (``verdict_forms.approves_all``)."""
        return self.authority is not None and approves_all(self.authority, self.call_forms)

    @property
    def may_decide(self) -> bool:
        return any(f.choices.verdicts for f in self.call_forms)

    @property
    def has_problems(self) -> bool:
        """Whether posted verdicts came back with a problem (the card then says which)."""
        return any(f.has_problems for f in self.call_forms)

    @property
    def kind(self) -> str:
        return self.pending.kind

    @property
    def deadline(self) -> datetime | None:
        """When nobody deciding ends the wait (docs/design.md §5.11), for a run waiting for
        approval or input; ``None``: no deadline (or a run in doubt, never subject to one)."""
        if self.run.status not in DEADLINE_STATUSES:
            return None
        return self.run.approval_deadline

    @property
    def escalated(self) -> bool:
        """Whether the wait's first deadline handed it to the escalation group
        (``run.escalated_to``, ``run.escalated_at``), which may decide it now."""
        return self.run.status in DEADLINE_STATUSES and self.run.escalated_at is not None

    @property
    def template(self) -> str:
        return f"approvals/cards/{self.pending.kind}.html"

    @property
    def form_id(self) -> str:
        return f"run{self.run.pk}"


def card_for(run: AgentRun, *, reader: Decider, data: Any | None = None) -> Card | None:
    """The card for a waiting run as ``reader`` sees it (an unbound input form for input turns,
    the reader's authority for approval and reconciliation turns, and for approval turns each
    call's verdict form, bound to ``data`` when given); ``None`` when the run waits for nobody.
    Everything the card shows about a call comes from ``card.pending``."""
    if not waits_for_a_human(run):
        return None
    pending = shown_turn(run, read_pending_turn(run))
    card = Card(run=run, pending=pending, cancel=cancel_for(run, reader=reader))
    if card.kind == INPUT:
        card.spec, card.form = input_form_for(card.pending, prefix=card.form_id)
    elif card.kind in (APPROVAL, RECONCILIATION):
        card.authority = approval_authority(
            user=reader,
            configuration=run.configuration,
            pending=card.pending,
            escalated_to=escalation_of(run),
        )
    if card.kind == APPROVAL:
        card.call_forms = turn_call_forms(
            run=run, pending=card.pending, reader=reader, prefix=card.form_id, data=data
        )
    return card


def cancel_for(run: AgentRun, *, reader: Decider) -> Authority | None:
    """What ``reader`` may do about cancelling ``run`` (``agentruns.authority``, the rule the
    cancel service checks); ``None`` for a run that has ended: there is nothing to cancel."""
    if run.is_terminal:
        return None
    return cancel_authority(
        reader,
        initiator_id=run.initiator_id,
        in_doubt=run.status == Status.WAITING_FOR_RECONCILIATION,
    )
