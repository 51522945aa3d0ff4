"""The inbox's decisions: approve or deny a turn, decide a selection of runs, reconcile, send
input. Each parses the POST, calls one service, and redirects back to ``next`` with one message
per run it decided, naming the run (``approvals.feedback``); an input form the tool's schema
refuses comes back in place — on the inbox (or the run page) it was sent from, its card open.

Served like every inbox view (``approvals.urls``): staff with ``agentruns.decide_agentrun``,
CSRF-protected, never cached.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.urls import Resolver404, resolve
from django.views.decorators.http import require_POST

from agentruns import selectors
from agentruns.authority import Decider
from agentruns.exceptions import (
    InvalidArguments,
    InvalidInput,
    InvalidRequest,
    LeaseholdError,
    NotWaiting,
    UnreadableState,
)
from agentruns.input_forms import input_form_for
from agentruns.models import AgentRun
from agentruns.services import runs
from agentruns.services.batch_decisions import ALREADY_DECIDED, runs_decide_batch
from agentruns.turns import APPROVAL, INPUT, UNREADABLE
from agentruns.verdict_forms import add_argument_errors, decision_arguments
from approvals import feedback
from approvals.cards import Card, card_for
from approvals.forms import BatchDecisionForm, DecisionForm, InputMetaForm, ReconciliationForm
from approvals.views import back_to, inbox_page, refused, run_page

# Decisions are recorded and handed to a worker (docs/design.md §5.8).
DECISION_MODE = "queued"

INCOMPLETE = "The form was incomplete — nothing was changed. Review the runs and try again."
APPROVE_IN_FULL = (
    "Nothing was decided: approving a selection needs the cards shown in full. Switch to full "
    "cards, read them, and approve again (denying works from either view)."
)


def _named(request: HttpRequest, run_uuid: UUID) -> AgentRun | UUID:
    """The run to name in a refusal (its configuration joined), or its uuid if it cannot be
    read by this reader."""
    return selectors.runs_by_uuid(run_uuids=[run_uuid], user=request.user).get(run_uuid, run_uuid)


def _refused(request: HttpRequest, exc: LeaseholdError, run_uuid: UUID) -> HttpResponseRedirect:
    return refused(request, exc, run=_named(request, run_uuid))


@require_POST
def decide(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Decide a pending turn, bound to the digest of the turn shown: *Approve all*, *Deny all*,
    or a verdict per call (approve, deny, answer, edit; a reason the model reads). Verdicts the
    forms refuse — or an edit the tool's schema refuses — come back in place (422), the card
    open with an error summary; every other refusal is a message after a redirect."""
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _refused(request, InvalidRequest(), run_uuid)
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        return refused(request, exc, run=run_uuid)
    card = card_for(run, reader=Decider(request.user), data=request.POST)
    if card is None or card.kind != APPROVAL:
        # Not (or no longer) an approval: the service says why, changing nothing.
        decision: dict[str, Any] = {"approved": form.approved}
    else:
        card.opened = True
        posted = decision_arguments(form.cleaned_data["decision"], card.call_forms)
        if posted is None:
            return _back_in_place(request, run, card)
        decision = posted
    try:
        result = runs.run_decide(
            run_uuid=run_uuid,
            actor=request.user,
            turn_digest=form.digest,
            mode=DECISION_MODE,
            **decision,
        )
    except InvalidArguments as exc:
        if card is None or card.kind != APPROVAL:
            return refused(request, exc, run=run)
        add_argument_errors(
            card.call_forms, call_id=str(exc.detail.get("call_id")), errors=exc.errors
        )
        return _back_in_place(request, run, card)
    except LeaseholdError as exc:
        return refused(request, exc, run=run)
    messages.success(
        request, feedback.about_run(result.run, feedback.decision_message(result, **decision))
    )
    return HttpResponseRedirect(back_to(request))


@require_POST
def decide_batch(request: HttpRequest) -> HttpResponse:
    """Approve or deny the selected cards, each run on its own (``runs_decide_batch``: its own
    digest, authority and transaction); then one line saying how many, and one per run saying
    what happened. Approving needs the cards to have been shown in full."""
    form = BatchDecisionForm(request.POST)
    if not form.is_valid():
        problems = form.errors.get("selected")
        messages.error(request, str(problems[0]) if problems else INCOMPLETE)
        return HttpResponseRedirect(back_to(request))
    if form.approved and not form.shown_in_full:
        messages.error(request, APPROVE_IN_FULL)
        return HttpResponseRedirect(back_to(request))
    outcomes = runs_decide_batch(
        selections=form.selections, actor=request.user, approved=form.approved, mode=DECISION_MODE
    )
    named = selectors.runs_by_uuid(run_uuids=[o.run_uuid for o in outcomes], user=request.user)
    messages.info(request, feedback.batch_summary(outcomes, approved=form.approved))
    for outcome in outcomes:
        line = feedback.batch_outcome_message(
            outcome, named.get(outcome.run_uuid), approved=form.approved
        )
        if outcome.decided:
            messages.success(request, line)
        elif outcome.outcome == ALREADY_DECIDED:
            messages.warning(request, line)
        else:
            messages.error(request, line)
    return HttpResponseRedirect(back_to(request))


@require_POST
def reconcile(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Settle an in-doubt write: landed, did not land, or abandon (docs/design.md §9)."""
    form = ReconciliationForm(request.POST)
    if not form.is_valid():
        return _refused(request, InvalidRequest(), run_uuid)
    verdict = form.cleaned_data["verdict"]
    try:
        result = runs.run_reconcile(
            run_uuid=run_uuid,
            actor=request.user,
            verdict=verdict,
            turn_digest=form.digest,
            mode=DECISION_MODE,
        )
    except LeaseholdError as exc:
        return _refused(request, exc, run_uuid)
    sentence = feedback.reconciliation_message(result, verdict=verdict)
    messages.success(request, feedback.about_run(result.run, sentence))
    return HttpResponseRedirect(back_to(request))


def _back_in_place(request: HttpRequest, run: AgentRun, card: Card) -> HttpResponse:
    """The page the input or verdicts were sent from, again, with ``card`` (its forms bound, each
    error said once) open in it, status 422: the inbox with its query (filter, page, view), or
    the run's page."""
    back = back_to(request)
    parts = urlsplit(back)
    try:
        name = resolve(parts.path).url_name
    except Resolver404:
        name = None
    if name == "run":
        return run_page(request, run, card=card, next_url=back, status=422)
    return inbox_page(
        request, params=QueryDict(parts.query), next_url=back, opened=card, status=422
    )


@require_POST
def submit_input(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Supply the values a tool asked for. Invalid values come back in place (status 422, the
    card open with an error summary and the values kept); every other refusal is a message after
    a redirect."""
    meta = InputMetaForm(request.POST)
    if not meta.is_valid():
        return _refused(request, InvalidRequest(), run_uuid)
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        return refused(request, exc, run=run_uuid)
    card = card_for(run, reader=Decider(request.user))
    if card is not None and card.kind == UNREADABLE:
        return refused(request, UnreadableState(), run=run)
    if card is None or card.kind != INPUT:
        return refused(request, NotWaiting(status=run.status), run=run)
    if card.spec is None or not card.spec.usable:
        return refused(request, InvalidRequest(), run=run)

    _, form = input_form_for(card.pending, request.POST, prefix=card.form_id)
    card.form = form
    card.opened = True
    card.changed = meta.digest != card.pending.turn_digest
    if form is not None and form.is_valid():
        try:
            result = runs.run_submit_input(
                run_uuid=run_uuid,
                actor=request.user,
                values=form.values(),
                turn_digest=meta.digest,
                mode=DECISION_MODE,
            )
        except InvalidInput as exc:
            form.add_schema_errors(exc.errors)
        except LeaseholdError as exc:
            return refused(request, exc, run=run)
        else:
            messages.success(request, feedback.about_run(run, feedback.input_message(result)))
            return HttpResponseRedirect(back_to(request))
    return _back_in_place(request, run, card)
