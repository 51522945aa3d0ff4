"""What the playground shows about a run that waits for a person: its pending turn as
``agentruns.turns`` reads it (an unreadable turn shown as such, without controls, as in the
inbox and the API), what the reader may decide on it (``agentruns.authority``), each call's
verdict form (``agentruns.verdict_forms``) and, for input, the form of the tool's schema. The
context of the decision block (``playground/_outcome.html``); it reads, it decides nothing."""

from __future__ import annotations

from typing import Any

from agentruns import display
from agentruns.authority import (
    Authority,
    Decider,
    approval_authority,
    cancel_authority,
    escalation_of,
)
from agentruns.input_forms import InputSpec, InputValuesForm, input_form_for
from agentruns.jsonview import pretty_arguments
from agentruns.models import AgentRun, Status
from agentruns.run_counts import run_counts
from agentruns.tools.shown import shown_turn
from agentruns.turns import APPROVAL, INPUT, read_pending_turn, waits_for_a_human
from agentruns.verdict_forms import CallForm, approves_all, turn_call_forms
from playground import trace

INPUT_PREFIX = "value"  # the input form's field names: value-f0, value-f1, …
VERDICT_PREFIX = "verdict"  # the verdict forms' field names: verdict-c1-verdict, …


def input_form_of(
    run: AgentRun, data: Any | None = None
) -> tuple[InputSpec | None, InputValuesForm | None, str]:
    """The input turn's spec and form (``None`` form when the spec cannot be offered), or no
    spec and the reason the stored turn cannot be read."""
    pending = shown_turn(run, read_pending_turn(run))
    if pending.kind != INPUT:
        return None, None, pending.problem
    spec, form = input_form_for(pending, data, prefix=INPUT_PREFIX)
    return spec, form, ""


def pending_context(
    run: AgentRun,
    reader: Any,
    input_form: InputValuesForm | None = None,
    verdicts: list[CallForm] | None = None,
) -> dict[str, Any]:
    """The run and, when it waits, its pending turn as ``agentruns.turns`` reads it (an
    unreadable turn is shown as such, without controls, as in the inbox and the API) and, for
    an approval, what ``reader`` may decide on it (``agentruns.authority``, as in the inbox) and
    each call's verdict form (``verdicts``: posted ones, re-shown with their problems)."""
    context: dict[str, Any] = {
        "run": run,
        "counts": run_counts(run),
        "timeline_url": trace.timeline_url(run),
        "cancel": cancel_for(run, reader),
    }
    if not waits_for_a_human(run):
        return context
    turn = shown_turn(run, read_pending_turn(run))
    context["turn"] = turn
    if turn.kind == APPROVAL:
        forms = verdicts or turn_call_forms(
            run=run, pending=turn, reader=Decider(reader), prefix=VERDICT_PREFIX
        )
        by_call = {form.call.id: form for form in forms}
        context["call_forms"] = forms
        context["calls"] = [
            {
                "verdict": by_call.get(c.id),
                "index": index,
                "id": c.id,
                "name": c.name,
                "effect": c.effect,
                "is_write": c.is_write,
                "args": pretty_arguments(c.arguments),
                "edit": c.edit,
                "original_args": pretty_arguments(c.edit.original_arguments) if c.edit else "",
                "preview": c.preview,
                "origin": c.origin,
            }
            for index, c in display.writes_first(turn.calls)
        ]
        context["preview_is_snapshot"] = run.configuration.preview_is_snapshot
        authority = approval_authority(
            user=reader,
            configuration=run.configuration,
            pending=turn,
            escalated_to=escalation_of(run),
        )
        context["authority"] = authority
        context["approve_all"] = approves_all(authority, forms)
        context["may_decide"] = any(f.choices.verdicts for f in forms)
        context["verdict_problems"] = [f for f in forms if f.has_problems]
    elif turn.kind == INPUT and turn.call is not None:
        context["input_call"] = {
            "name": turn.call.name,
            "origin": turn.call.origin,
            "args": pretty_arguments(turn.call.arguments),
            "question": turn.question,
        }
        spec: InputSpec | None
        form: InputValuesForm | None
        if input_form is not None:  # a posted form, re-shown with its errors
            spec, form, problem = input_form.spec, input_form, ""
        else:
            spec, form, problem = input_form_of(run)
        context.update(input_spec=spec, input_form=form, input_problem=problem)
    return context


def cancel_for(run: AgentRun, reader: Any) -> Authority | None:
    """Whether ``reader`` may cancel ``run`` (the cancel service's rule); ``None``: it ended."""
    if run.is_terminal:
        return None
    return cancel_authority(
        reader,
        initiator_id=run.initiator_id,
        in_doubt=run.status == Status.WAITING_FOR_RECONCILIATION,
    )
