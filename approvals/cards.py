"""A card: one waiting run as the inbox shows it — its pending turn read by ``agentruns.turns``
and, for input, the form generated from the schema. Presentation only; no queries."""

from __future__ import annotations

from dataclasses import dataclass

from agentruns.input_forms import InputSpec, InputValuesForm, input_form_for
from agentruns.models import AgentRun
from agentruns.turns import INPUT, PendingTurn, read_pending_turn, waits_for_a_human


@dataclass
class Card:
    run: AgentRun
    pending: PendingTurn
    spec: InputSpec | None = None
    form: InputValuesForm | None = None
    # The posted digest differed from the turn shown now (input re-rendered after a change).
    changed: bool = False

    @property
    def kind(self) -> str:
        return self.pending.kind

    @property
    def template(self) -> str:
        return f"approvals/cards/{self.pending.kind}.html"

    @property
    def form_id(self) -> str:
        return f"run{self.run.pk}"


def card_for(run: AgentRun) -> Card | None:
    """The card for a waiting run (an unbound input form for input turns); ``None`` when the
    run waits for nobody."""
    if not waits_for_a_human(run):
        return None
    card = Card(run=run, pending=read_pending_turn(run))
    if card.kind == INPUT:
        card.spec, card.form = input_form_for(card.pending, prefix=card.form_id)
    return card
