"""The inbox's forms: a decision, a reconciliation verdict, and an input submission's digest. The
input values form generated from a schema is ``agentruns.input_forms`` (shared with the
playground).

Forms parse what staff posted; they decide nothing about a run (the services do).
"""

from __future__ import annotations

from django import forms

from agentruns.services.runs import RECONCILIATION_VERDICTS


class _Bound(forms.Form):
    """Every decision carries the digest of the turn the human saw, and where to go back to."""

    turn_digest = forms.CharField(required=False, max_length=128, widget=forms.HiddenInput)
    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)

    @property
    def digest(self) -> str | None:
        return self.cleaned_data.get("turn_digest") or None


class DecisionForm(_Bound):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])

    @property
    def approved(self) -> bool:
        return self.cleaned_data["decision"] == "approve"


class ReconciliationForm(_Bound):
    verdict = forms.ChoiceField(choices=[(v, v) for v in RECONCILIATION_VERDICTS])


class InputMetaForm(_Bound):
    """The digest and return address of an input submission (the values are a separate form)."""


class CancelForm(forms.Form):
    """The confirmation step's POST: where to go back to (the run is in the URL)."""

    next = forms.CharField(required=False, max_length=2000, widget=forms.HiddenInput)
