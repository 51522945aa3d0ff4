"""Playground forms: what to run. (A human's input values are parsed by
``agentruns.input_forms``, the form the approvals inbox uses too.)"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.validators import MaxValueValidator

from agentruns import display
from agentruns.conf import app_settings
from agentruns.models import AgentConfiguration
from agentruns.tools import registry


def _tool_choices() -> list[tuple[str, str]]:
    return [(t.name, f"{t.name} — {display.effect_text(t.effect)}") for t in registry.all()]


class RunForm(forms.Form):
    # In the order they were added (the demo's Notes assistant first): the first is chosen
    # unless the page is opened with ``?configuration=<slug>``.
    configuration = forms.ModelChoiceField(
        queryset=AgentConfiguration.objects.filter(is_active=True).order_by("pk"),
        to_field_name="slug",
        empty_label=None,
    )
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), strip=False)
    tools = forms.MultipleChoiceField(
        choices=_tool_choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Narrow the configuration's tools; none ticked = the configuration's own.",
    )
    system_prompt = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        help_text="Overrides the configuration's system prompt.",
    )
    max_iterations = forms.IntegerField(
        required=False, min_value=1, help_text="Round cap (the configuration's when empty)."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limit = app_settings().max_iterations  # read per request: settings may change
        field = self.fields["max_iterations"]
        field.validators.append(MaxValueValidator(limit))
        field.widget.attrs["max"] = limit

    def start_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``runs.run_start_sync`` (without initiator and hooks)."""
        data = self.cleaned_data
        options: dict[str, Any] = {}
        if data.get("tools"):
            options["tools"] = list(data["tools"])
        if data.get("system_prompt"):
            options["system_prompt"] = data["system_prompt"]
        if data.get("max_iterations") is not None:
            options["max_iterations"] = data["max_iterations"]
        return {
            "configuration": data["configuration"],
            "prompt": data["prompt"],
            "options": options or None,
        }
