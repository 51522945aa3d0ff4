"""The inbox's forms: a decision, a selection of runs decided at once, a reconciliation verdict,
and an input submission's digest. The input values form generated from a schema is
``agentruns.input_forms`` (shared with the playground).

Forms parse what staff posted; they decide nothing about a run (the services do).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import forms

from agentruns.services.batch_decisions import MAX_SELECTED, Selected
from agentruns.services.runs import RECONCILIATION_VERDICTS
from agentruns.verdict_forms import APPROVE_ALL, DECISIONS

# The inbox's two ways of showing cards: in full, or one line each (expand to decide).
FULL = "full"
COMPACT = "compact"


class _Bound(forms.Form):
    """Every decision carries the digest of the turn the human saw, and where to go back to."""

    turn_digest = forms.CharField(required=False, max_length=128, widget=forms.HiddenInput)
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    @property
    def digest(self) -> str | None:
        return self.cleaned_data.get("turn_digest") or None


class DecisionForm(_Bound):
    """*Approve all*, *Deny all*, or the per-call verdicts posted beside it
    (``agentruns.verdict_forms``)."""

    decision = forms.ChoiceField(choices=[(d, d) for d in DECISIONS])

    @property
    def approved(self) -> bool:
        return self.cleaned_data["decision"] == APPROVE_ALL


class SelectionField(forms.Field):
    """The cards ticked for a batch decision: each checkbox's value is ``<run uuid>:<digest of
    the turn its card showed>``, so every run is decided on exactly what its card showed."""

    widget = forms.MultipleHiddenInput
    default_error_messages = {
        "required": "Select at least one run, then approve or deny the selection.",
        "invalid": "A selected card could not be read — nothing was changed. Select again.",
        "too_many": f"Select at most {MAX_SELECTED} runs at once.",
    }

    def to_python(self, value: Any) -> list[Selected]:
        if not value:
            return []
        if not isinstance(value, list | tuple) or len(value) > MAX_SELECTED:
            raise forms.ValidationError(self.error_messages["too_many"], code="too_many")
        selected: list[Selected] = []
        for item in value:
            uuid, _, digest = str(item).partition(":")
            try:
                selected.append(Selected(run_uuid=UUID(uuid), turn_digest=digest[:128]))
            except ValueError:
                raise forms.ValidationError(
                    self.error_messages["invalid"], code="invalid"
                ) from None
            if not digest:
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return selected


class BatchDecisionForm(forms.Form):
    """Approve or deny the selected runs. ``shown`` says how the page showed their cards: a
    selection is approved only from cards shown in full (never from one-line rows)."""

    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
    selected = SelectionField()
    shown = forms.ChoiceField(choices=[(FULL, FULL), (COMPACT, COMPACT)], required=False)
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    @property
    def approved(self) -> bool:
        return self.cleaned_data["decision"] == "approve"

    @property
    def shown_in_full(self) -> bool:
        return self.cleaned_data.get("shown") == FULL

    @property
    def selections(self) -> list[Selected]:
        return list(self.cleaned_data["selected"])


class ReconciliationForm(_Bound):
    verdict = forms.ChoiceField(choices=[(v, v) for v in RECONCILIATION_VERDICTS])


class InputMetaForm(_Bound):
    """The digest and return address of an input submission (the values are a separate form)."""


class CancelForm(forms.Form):
    """The confirmation step's POST: where to go back to (the run is in the URL)."""

    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)
