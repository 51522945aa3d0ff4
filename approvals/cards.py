"""A card: one waiting run as the inbox shows it — its pending turn read by ``agentruns.turns``
and, for input, the form generated from the schema. Presentation only; no queries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentruns.input_forms import InputSpec, InputValuesForm, input_spec
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


def input_form(run: AgentRun, spec: InputSpec, data: Any | None = None) -> InputValuesForm | None:
    if not spec.usable:
        return None
    return InputValuesForm(data, spec=spec, prefix=f"run{run.pk}")


def card_for(run: AgentRun) -> Card | None:
    """The card for a waiting run (an unbound input form for input turns); ``None`` when the
    run waits for nobody."""
    if not waits_for_a_human(run):
        return None
    pending = read_pending_turn(run)
    if pending.kind != INPUT:
        return Card(run=run, pending=pending)
    spec = input_spec(pending.input_schema or {}, order=pending.field_order)
    return Card(run=run, pending=pending, spec=spec, form=input_form(run, spec))
