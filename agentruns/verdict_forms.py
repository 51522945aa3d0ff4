"""The per-call verdict forms of an approval card, for everyone who shows one (the approvals
inbox, the playground): for each call, a verdict (approve, deny, answer, edit — what the reader
may give it, ``agentruns.authority.call_choices``), a reason, an answer, and an edit of its
arguments built from the tool's input schema as the input cards are (``agentruns.input_forms``),
the model's values filled in — or its arguments as raw JSON where that form cannot show the
schema (a field of another type, a key the schema does not declare).

``turn_call_forms(...)`` builds them for a run's approval turn as a reader sees it (bound to a
POST when given); ``decision_arguments(...)`` turns what a card posted — *Approve all*, *Deny
all*, or the verdicts per call — into the arguments of ``run_decide``, or ``None`` with each
problem on its form; ``add_argument_errors`` puts the service's schema refusal
(``InvalidArguments``) on the edit it concerns. Forms parse; they decide nothing about a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms

from agentruns.authority import Authority, CallChoices, Decider, call_choices
from agentruns.input_forms import InputSpec, InputValuesForm, input_spec
from agentruns.jsonview import pretty_arguments
from agentruns.models import AgentRun
from agentruns.services.decisions import edit_schema
from agentruns.tools.schemas import SchemaError
from agentruns.turns import (
    ANSWER,
    APPROVE,
    DENY,
    EDIT,
    MAX_ANSWER_CHARS,
    MAX_REASON_CHARS,
    Call,
    CallVerdict,
    PendingTurn,
)
from agentruns.versions import pinned_configuration

# What a card's buttons post as ``decision``.
APPROVE_ALL = "approve"
DENY_ALL = "deny"
PER_CALL = "calls"
DECISIONS = (APPROVE_ALL, DENY_ALL, PER_CALL)

# How each verdict reads on a card.
VERDICT_LABELS: dict[str, str] = {
    APPROVE: "Approve: run it",
    DENY: "Deny: do not run it",
    ANSWER: "Answer it yourself: the tool does not run",
    EDIT: "Edit the arguments: a new card follows, to approve",
}
_NOT_JSON = object()
RAW_EDIT_NOTE = "The arguments are shown as JSON: the form cannot show {why}."
NO_VERDICT = "Choose what happens to this call."
REASON_WITH_DENIAL = "A reason goes with a denial: choose Deny, or clear the reason."


class CallVerdictForm(forms.Form):
    """One call's verdict, reason and answer (its edit is a form of its own, ``CallForm.edit``,
    or the raw JSON field ``arguments_json``)."""

    verdict = forms.ChoiceField(
        widget=forms.RadioSelect, required=False, error_messages={"invalid_choice": NO_VERDICT}
    )
    reason = forms.CharField(
        required=False,
        strip=False,
        max_length=MAX_REASON_CHARS,
        label="Reason, if you deny it (optional; the model reads it, marked as your words)",
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    answer = forms.CharField(
        required=False,
        strip=False,
        max_length=MAX_ANSWER_CHARS,
        label="The result the model receives instead",
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    answer_is_json = forms.BooleanField(
        required=False, label="Read the answer as JSON (otherwise it is sent as text)"
    )
    arguments_json = forms.CharField(
        required=False, label="Arguments (JSON object)", widget=forms.Textarea(attrs={"rows": 6})
    )

    def __init__(self, *args: Any, verdicts: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["verdict"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(v, VERDICT_LABELS[v]) for v in verdicts]


def _raw_reason(arguments: Any, spec: InputSpec) -> str:
    """Why the schema form cannot edit ``arguments`` (""): it can."""
    if not isinstance(arguments, dict):
        return "arguments that are not a JSON object"
    if spec.blocking:
        return "this tool's input schema"
    if spec.omitted:
        return "every field of this tool's input schema"
    undeclared = [key for key in arguments if key not in spec.keys.values()]
    if undeclared:
        return f"the key “{undeclared[0]}”, which the tool's input schema does not declare"
    return ""


@dataclass
class CallForm:
    """Everything a card shows to decide one call: the call (as shown), its position in the
    model's order, what the reader may give it, its verdict form and its edit."""

    call: Call
    index: int
    choices: CallChoices
    form: CallVerdictForm
    # The edit as a form of the tool's schema, the model's values filled in; ``None``: raw JSON
    # (``form["arguments_json"]``) or no edit offered.
    edit: InputValuesForm | None = None
    edit_note: str = ""

    @property
    def effect(self) -> str:
        return self.call.effect

    @property
    def offers_answer(self) -> bool:
        return self.choices.allows(ANSWER)

    @property
    def offers_edit(self) -> bool:
        return self.choices.allows(EDIT)

    @property
    def chosen(self) -> str:
        """The verdict posted (or ""), for opening the part of the card it concerns."""
        value = self.form["verdict"].value()
        return value if isinstance(value, str) else ""

    @property
    def has_problems(self) -> bool:
        """Whether the posted form has a problem to show (an unchosen edit is not checked)."""
        if not self.form.is_bound:
            return False
        edit = self.edit is not None and self.chosen == EDIT and self.edit.has_problems
        return bool(self.form.errors) or edit

    def reason(self) -> str | None:
        """The posted reason ("" for none), or ``None`` when the form has a problem."""
        return self.form.cleaned_data["reason"] if self.form.is_valid() else None

    def verdict(self) -> CallVerdict | None:
        """The posted verdict, or ``None`` with each problem recorded on the forms."""
        if not self.form.is_valid():
            return None
        data = self.form.cleaned_data
        chosen = data["verdict"]
        if not chosen:
            self.form.add_error("verdict", NO_VERDICT)
            return None
        reason = data["reason"]
        if reason and chosen != DENY:
            self.form.add_error("reason", REASON_WITH_DENIAL)
            return None
        if chosen == ANSWER:
            return self._answer()
        if chosen == EDIT:
            return self._edit()
        return CallVerdict(call_id=self.call.id, verdict=chosen, reason=reason)

    def _json(self, name: str, text: str) -> Any:
        """``text`` read as JSON, or ``_NOT_JSON`` with the problem on the field ``name``."""
        try:
            return json.loads(text or "")
        except json.JSONDecodeError as exc:
            self.form.add_error(name, f"This is not JSON ({exc.msg}, line {exc.lineno}).")
        except RecursionError:
            self.form.add_error(name, "This JSON is nested too deeply.")
        return _NOT_JSON

    def _answer(self) -> CallVerdict | None:
        text = self.form.cleaned_data["answer"]
        if text == "":
            self.form.add_error("answer", "Give the result the model should receive.")
            return None
        answer: Any = text
        if self.form.cleaned_data["answer_is_json"]:
            answer = self._json("answer", text)
            if answer is _NOT_JSON:
                return None
        return CallVerdict(call_id=self.call.id, verdict=ANSWER, answer=answer)

    def _edit(self) -> CallVerdict | None:
        if self.edit is not None:
            if not self.edit.is_valid():
                return None
            arguments: Any = self.edit.values()
        else:
            arguments = self._json("arguments_json", self.form.cleaned_data["arguments_json"])
            if arguments is _NOT_JSON:
                return None
            if not isinstance(arguments, dict):
                self.form.add_error("arguments_json", "The arguments must be a JSON object.")
                return None
        return CallVerdict(call_id=self.call.id, verdict=EDIT, arguments=arguments)


def _edit_form(
    call: Call, schema: Mapping[str, Any] | None, data: Any | None, prefix: str
) -> tuple[InputValuesForm | None, str]:
    """The edit of ``call`` as a form of ``schema``, or ``None`` and why it is raw JSON."""
    if schema is None:
        return None, ""
    # The fields in the order the tool declares them (the registry's schema, not a stored copy
    # whose keys PostgreSQL's jsonb may have reordered).
    spec = input_spec(dict(schema))
    why = _raw_reason(call.arguments, spec)
    if why:
        return None, RAW_EDIT_NOTE.format(why=why)
    initial = {name: call.arguments.get(key) for name, key in spec.keys.items()}
    return InputValuesForm(data, spec=spec, prefix=f"{prefix}-e", initial=initial), ""


def call_forms(
    *,
    calls: Sequence[Call],
    choices: Sequence[CallChoices],
    schemas: Mapping[str, Mapping[str, Any] | None],
    prefix: str,
    data: Any | None = None,
) -> list[CallForm]:
    """The verdict forms of an approval card's ``calls`` (as shown, in the model's order), with
    the ``choices`` ``call_choices`` gives the reader and each call's edit ``schemas`` (by call
    id; ``None``: its tool is not available to the run, so no edit is offered). Bound to
    ``data`` (a POST) when given; field names start ``<prefix>-c<n>``."""
    offered = {choice.call_id: choice for choice in choices}
    built = []
    for index, call in enumerate(calls, start=1):
        choice = offered.get(call.id, CallChoices(call.id, ()))
        schema = schemas.get(call.id)
        if schema is None and choice.allows(EDIT):
            choice = CallChoices(
                call.id,
                tuple(v for v in choice.verdicts if v != EDIT),
                choice.missing,
                choice.self_approval,
            )
        name = f"{prefix}-c{index}"
        initial = {"arguments_json": pretty_arguments(call.arguments)}
        form = CallVerdictForm(data, verdicts=choice.verdicts, prefix=name, initial=initial)
        # The edit is read (and its problems said) only when the call's verdict is *edit*.
        edited = data if form["verdict"].value() == EDIT else None
        edit, note = _edit_form(call, schema, edited, name) if choice.allows(EDIT) else (None, "")
        built.append(CallForm(call, index, choice, form, edit, note))
    return built


def turn_call_forms(
    *, run: AgentRun, pending: PendingTurn, reader: Decider, prefix: str, data: Any | None = None
) -> list[CallForm]:
    """``call_forms`` for ``run``'s approval turn ``pending`` (as its card shows it) as ``reader``
    may decide it (``call_choices``: the rules the service checks), each call's edit built from
    its tool's schema as the run would call it (``edit_schema``)."""
    configuration = pinned_configuration(run)
    choices = call_choices(
        user=reader, configuration=configuration, pending=pending, initiator_id=run.initiator_id
    )
    return call_forms(
        calls=pending.calls,
        choices=choices,
        schemas={c.id: edit_schema(run=run, call_id=c.id) for c in pending.calls},
        prefix=prefix,
        data=data,
    )


def approves_all(authority: Authority, forms: Sequence[CallForm]) -> bool:
    """Whether a card offers *Approve all*: the reader may approve the whole turn (``authority``:
    ``approval_authority``, the whole-turn rule the service checks, an escalation group
    included) and four-eyes keeps no call from them."""
    return bool(forms) and authority.allowed and not any(f.choices.self_approval for f in forms)


def decision_arguments(decision: str, forms: Sequence[CallForm]) -> dict[str, Any] | None:
    """What a card's ``decision`` asks ``run_decide`` for: ``approved=True`` (*Approve all*);
    for *Deny all*, ``approved=False`` — or, when a reason was typed on a call, every call
    denied, each with its reason; for ``calls``, the ``verdicts`` posted per call. ``None``: a
    form has a problem (each said on its call)."""
    if decision == APPROVE_ALL:
        return {"approved": True}
    if decision == PER_CALL:
        verdicts = posted_verdicts(forms)
        return None if verdicts is None else {"verdicts": verdicts}
    reasons = [(form.call.id, form.reason()) for form in forms]
    if any(reason is None for _, reason in reasons):
        return None
    if not any(reason for _, reason in reasons):
        return {"approved": False}
    return {
        "verdicts": [
            CallVerdict(call_id=call_id, verdict=DENY, reason=reason or "")
            for call_id, reason in reasons
        ]
    }


def posted_verdicts(forms: Sequence[CallForm]) -> list[CallVerdict] | None:
    """One verdict per call, in the model's order; ``None`` when any form has a problem (each
    said on its form)."""
    verdicts = [form.verdict() for form in forms]
    return None if any(v is None for v in verdicts) else [v for v in verdicts if v is not None]


def add_argument_errors(
    forms: Sequence[CallForm], *, call_id: str, errors: Sequence[SchemaError]
) -> None:
    """The service refused the edit of ``call_id`` against its tool's schema: show each error
    on that call's edit (its field, or the JSON field)."""
    for form in forms:
        if form.call.id != call_id:
            continue
        if form.edit is not None:
            form.edit.add_schema_errors(errors)
        else:
            for error in errors or [SchemaError((), "The arguments do not match the schema.")]:
                form.form.add_error("arguments_json", str(error))
