"""The inbox's views. Each parses the request, calls one selector or service, and renders or
redirects (post-redirect-get). Refusals become messages through ``approvals.feedback``.

Every view is served through ``admin.site.admin_view`` and ``decider_required`` (see
``approvals.urls``): staff with ``agentruns.decide_agentrun`` only, CSRF-protected, never cached.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from uuid import UUID

from django.contrib import admin, messages
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agentruns import audit, review_links, selectors
from agentruns.authority import Decider
from agentruns.exceptions import (
    InvalidInput,
    InvalidRequest,
    LeaseholdError,
    NotWaiting,
    ReviewLinkExpired,
    ReviewLinkForAnotherAccount,
    ReviewLinkInvalid,
    UnreadableState,
)
from agentruns.input_forms import input_form_for
from agentruns.models import AgentRun
from agentruns.services import runs
from agentruns.turns import INPUT, UNREADABLE
from approvals import feedback
from approvals.cards import Card, cancel_for, card_for
from approvals.forms import CancelForm, DecisionForm, InputMetaForm, ReconciliationForm

INBOX_PAGE_SIZE = 20
RECENT_PAGE_SIZE = 50
# Decisions are recorded and handed to a worker (docs/design.md §5.8).
DECISION_MODE = "queued"

View = Callable[..., HttpResponseBase]


def decider_required(view: View) -> View:
    """Refuse (the admin's way: a redirect to its login page) anyone who may not decide runs."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.has_perm(runs.DECIDE_PERMISSION):
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        return view(request, *args, **kwargs)

    return guarded


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {**admin.site.each_context(request), **extra}


def _next(request: HttpRequest, default: str = "") -> str:
    """Where to go back to: the posted (or, for a GET, queried) ``next`` when it is a URL of this
    site, else ``default`` (the inbox)."""
    target = (request.POST if request.method == "POST" else request.GET).get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default or reverse("approvals:inbox")


def _refused(request: HttpRequest, exc: LeaseholdError) -> HttpResponseRedirect:
    messages.error(request, feedback.refusal_message(exc))
    return HttpResponseRedirect(_next(request))


# --- Pages -------------------------------------------------------------------------------------


@require_GET
def inbox(request: HttpRequest) -> HttpResponse:
    """Runs waiting for a decision, input or reconciliation, oldest first, one card each."""
    kind = request.GET.get("kind")
    kind = kind if kind in selectors.INBOX_KINDS else None
    reader = Decider(request.user)  # reads the reader's groups once for the page
    page = Paginator(selectors.inbox_runs(user=request.user, kind=kind), INBOX_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(
        request,
        "approvals/inbox.html",
        _context(
            request,
            title="Approvals inbox",
            page=page,
            cards=[card_for(run, reader=reader) for run in page.object_list],
            counts=selectors.inbox_counts(user=request.user),
            kind=kind,
            next=request.get_full_path(),
        ),
    )


@require_GET
def recent(request: HttpRequest) -> HttpResponse:
    """Every run, newest first, with status, termination reason and approval attribution."""
    page = Paginator(selectors.recent_runs(user=request.user), RECENT_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    page_runs = list(page.object_list)
    attributions = selectors.run_attributions(runs=page_runs)
    return render(
        request,
        "approvals/recent.html",
        _context(
            request,
            title="Recent runs",
            page=page,
            rows=[(run, attributions.get(run.pk)) for run in page_runs],
        ),
    )


def _run_page(
    request: HttpRequest, run: AgentRun, *, card: Card | None, next_url: str, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "approvals/run.html",
        _context(
            request,
            title=f"Run {run.uuid}",
            run=run,
            card=card,
            events=list(selectors.run_events(run=run)),
            attribution=selectors.run_attributions(runs=[run]).get(run.pk),
            cancel=cancel_for(run, reader=Decider(request.user)),
            next=next_url,
        ),
        status=status,
    )


@require_GET
def run_detail(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """One run: what it waits for (with its controls) and its timeline, every event in order."""
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        messages.error(request, feedback.refusal_message(exc))
        return HttpResponseRedirect(reverse("approvals:inbox"))
    return _run_page(
        request,
        run,
        card=card_for(run, reader=Decider(request.user)),
        next_url=request.get_full_path(),
    )


@require_GET
def run_audit(request: HttpRequest, run_uuid: UUID) -> HttpResponseBase:
    """The run's audit trail as a JSON Lines download (``agentruns.audit.export_lines``)."""
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        messages.error(request, feedback.refusal_message(exc))
        return HttpResponseRedirect(reverse("approvals:inbox"))
    response = StreamingHttpResponse(audit.export_lines(run), content_type="application/jsonl")
    response["Content-Disposition"] = f'attachment; filename="{audit.export_filename(run)}"'
    return response


@require_GET
def review(request: HttpRequest, run_uuid: UUID, token: str) -> HttpResponse:
    """A notification's signed link (``agentruns.review_links``): the run's whole card with its
    verdict buttons, when the link is the reader's and the turn it announced still waits; else
    why not (another account, expired, changed or decided), with the way to the run. Opening it
    decides nothing: the card's buttons post to ``decide`` (CSRF-protected)."""
    run_url = reverse("approvals:run", args=[run_uuid])
    try:
        opened = review_links.review_open(token=token, run_uuid=run_uuid, user=request.user)
    except (ReviewLinkInvalid, ReviewLinkForAnotherAccount, ReviewLinkExpired) as exc:
        return render(
            request,
            "approvals/review.html",
            _context(request, title="Review link", refusal=exc, run_url=run_url),
            status=exc.status,
        )
    except LeaseholdError as exc:
        return _refused(request, exc)
    reader = Decider(request.user)
    card = card_for(opened.run, reader=reader) if opened.state == review_links.WAITING else None
    return render(
        request,
        "approvals/review.html",
        _context(
            request,
            title=f"Review run {opened.run.uuid}",
            review=opened,
            run=opened.run,
            card=card,
            run_url=run_url,
            next=run_url,
        ),
    )


@require_http_methods(["GET", "POST"])
def cancel(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """*Cancel run*. GET: the confirmation step (what cancelling does, and whether the reader
    may); POST: cancel it through ``runs.run_cancel`` (its rules, its guarded write), then go
    back to ``next``. A cancel racing a decision: whichever guarded write comes second finds
    the run no longer waiting and changes nothing."""
    back = _next(request, reverse("approvals:run", args=[run_uuid]))
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        return _refused(request, exc)
    if request.method == "GET":
        return render(
            request,
            "approvals/cancel.html",
            _context(
                request,
                title=f"Cancel run {run.uuid}?",
                run=run,
                cancel=cancel_for(run, reader=Decider(request.user)),
                next=back,
            ),
        )
    if not CancelForm(request.POST).is_valid():
        return _refused(request, InvalidRequest())
    try:
        cancelled = runs.run_cancel(
            run_uuid=run_uuid, actor=request.user, note="cancelled in the approvals inbox"
        )
    except LeaseholdError as exc:
        messages.error(request, feedback.refusal_message(exc))
        return HttpResponseRedirect(back)
    if cancelled:
        messages.success(request, feedback.cancel_message(cancelled=True, status=""))
    else:
        run.refresh_from_db(fields=["status"])
        messages.warning(request, feedback.cancel_message(cancelled=False, status=run.status))
    return HttpResponseRedirect(back)


# --- Decisions (POST, then redirect) ------------------------------------------------------------


@require_POST
def decide(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Approve or deny a pending turn, bound to the digest of the turn shown."""
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _refused(request, InvalidRequest())
    try:
        result = runs.run_decide(
            run_uuid=run_uuid,
            actor=request.user,
            approved=form.approved,
            turn_digest=form.digest,
            mode=DECISION_MODE,
        )
    except LeaseholdError as exc:
        return _refused(request, exc)
    messages.success(request, feedback.approval_message(result, approved=form.approved))
    return HttpResponseRedirect(_next(request))


@require_POST
def reconcile(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Settle an in-doubt write: landed, did not land, or abandon (docs/design.md §9)."""
    form = ReconciliationForm(request.POST)
    if not form.is_valid():
        return _refused(request, InvalidRequest())
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
        return _refused(request, exc)
    messages.success(request, feedback.reconciliation_message(result, verdict=verdict))
    return HttpResponseRedirect(_next(request))


@require_POST
def submit_input(request: HttpRequest, run_uuid: UUID) -> HttpResponse:
    """Supply the values a tool asked for. Invalid values re-render the run with status 422, an
    error summary and the values kept; every other refusal is a message after a redirect."""
    meta = InputMetaForm(request.POST)
    if not meta.is_valid():
        return _refused(request, InvalidRequest())
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        return _refused(request, exc)
    card = card_for(run, reader=Decider(request.user))
    if card is not None and card.kind == UNREADABLE:
        return _refused(request, UnreadableState())
    if card is None or card.kind != INPUT:
        return _refused(request, NotWaiting(status=run.status))
    if card.spec is None or not card.spec.usable:
        return _refused(request, InvalidRequest())

    _, form = input_form_for(card.pending, request.POST, prefix=card.form_id)
    card.form = form
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
            return _refused(request, exc)
        else:
            messages.success(request, feedback.input_message(result))
            return HttpResponseRedirect(_next(request))
    return _run_page(request, run, card=card, next_url=_next(request), status=422)
