"""The inbox's pages (the decisions, posted from them, are ``approvals.decision_views``). Each
parses the request, calls one selector or service, and renders or redirects
(post-redirect-get). Refusals become messages through ``approvals.feedback``.

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
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    QueryDict,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods

from agentruns import audit, review_links, selectors
from agentruns.authority import Decider
from agentruns.exceptions import (
    InvalidRequest,
    LeaseholdError,
    ReviewLinkExpired,
    ReviewLinkForAnotherAccount,
    ReviewLinkInvalid,
)
from agentruns.models import AgentRun
from agentruns.services import runs
from agentruns.turns import APPROVAL
from approvals import feedback
from approvals.cards import Card, cancel_for, card_for
from approvals.forms import COMPACT, CancelForm

INBOX_PAGE_SIZE = 20
RECENT_PAGE_SIZE = 50
RULES_SHOWN = 50

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


def back_to(request: HttpRequest, default: str = "") -> str:
    """Where to go back to: the posted (or, for a GET, queried) ``next`` when it is a URL of this
    site, else ``default`` (the inbox)."""
    target = (request.POST if request.method == "POST" else request.GET).get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default or reverse("approvals:inbox")


def refused(
    request: HttpRequest, exc: LeaseholdError, *, run: AgentRun | UUID | None = None
) -> HttpResponseRedirect:
    """Say why nothing changed — about ``run`` when one is named — and go back to ``next``."""
    sentence = feedback.refusal_message(exc)
    messages.error(request, sentence if run is None else feedback.about_run(run, sentence))
    return HttpResponseRedirect(back_to(request))


# --- Pages -------------------------------------------------------------------------------------


def inbox_page(
    request: HttpRequest,
    *,
    params: QueryDict,
    next_url: str,
    opened: Card | None = None,
    status: int = 200,
) -> HttpResponse:
    """The inbox as ``params`` (its query: ``kind``, ``page``, ``view``) asks for it. ``opened``:
    a card to show as it stands (an input form coming back with its errors), in place of the
    run's card on the page (first, if the run is not on it), open in the compact view."""
    kind = params.get("kind")
    kind = kind if kind in selectors.INBOX_KINDS else None
    compact = params.get("view") == COMPACT
    reader = Decider(request.user)  # reads the reader's groups once for the page
    page = Paginator(selectors.inbox_runs(user=request.user, kind=kind), INBOX_PAGE_SIZE).get_page(
        params.get("page")
    )
    cards = [card_for(run, reader=reader) for run in page.object_list]
    if opened is not None:
        at = next((i for i, c in enumerate(cards) if c and c.run.pk == opened.run.pk), None)
        cards = [opened, *cards] if at is None else [*cards[:at], opened, *cards[at + 1 :]]
    return render(
        request,
        "approvals/inbox.html",
        _context(
            request,
            title="Approvals inbox",
            page=page,
            cards=cards,
            selectable=any(
                c.kind == APPROVAL and c.authority and c.authority.may_decide for c in cards if c
            ),
            counts=selectors.inbox_counts(user=request.user),
            # Standing approvals, read-only (made and revoked in the admin and the API).
            rules=list(selectors.approval_rules(active=True)[:RULES_SHOWN]),
            kind=kind,
            compact=compact,
            view_query="&view=compact" if compact else "",
            next=next_url,
        ),
        status=status,
    )


@require_GET
def inbox(request: HttpRequest) -> HttpResponse:
    """Runs waiting for a decision, input or reconciliation, oldest first, one card each — in
    full, or one line each (``?view=compact``: expand a line to decide)."""
    return inbox_page(request, params=request.GET, next_url=request.get_full_path())


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


def run_page(
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
    return run_page(
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
        return refused(request, exc, run=run_uuid)
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
    back = back_to(request, reverse("approvals:run", args=[run_uuid]))
    try:
        run = selectors.run_get(run_uuid=run_uuid, user=request.user)
    except LeaseholdError as exc:
        return refused(request, exc, run=run_uuid)
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
        return refused(request, InvalidRequest(), run=run)
    try:
        cancelled = runs.run_cancel(
            run_uuid=run_uuid, actor=request.user, note="cancelled in the approvals inbox"
        )
    except LeaseholdError as exc:
        messages.error(request, feedback.about_run(run, feedback.refusal_message(exc)))
        return HttpResponseRedirect(back)
    if cancelled:
        sentence = feedback.cancel_message(cancelled=True, status="")
        messages.success(request, feedback.about_run(run, sentence))
    else:
        run.refresh_from_db(fields=["status"])
        sentence = feedback.cancel_message(cancelled=False, status=run.status)
        messages.warning(request, feedback.about_run(run, sentence))
    return HttpResponseRedirect(back)
