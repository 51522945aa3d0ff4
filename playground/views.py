"""The playground's pages: run a configuration batch or streamed, watch its trace, decide.

Views parse, call one ``agentruns`` service or selector, and render. Allowed: staff with
``playground.use_playground`` (superusers implicitly); anyone else is sent to the admin login.
Starting a run also needs ``agentruns.start_agentrun`` (``runs.run_authorize_start``), as the
API's does; without it the page says so and offers no Run buttons.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import user_passes_test
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agentruns import display, selectors
from agentruns.authority import (
    Decider,
    start_authority,
)
from agentruns.exceptions import (
    InvalidArguments,
    InvalidInput,
    InvalidRequest,
    LeaseholdError,
    RunNotFound,
)
from agentruns.input_forms import InputValuesForm
from agentruns.leases import EventSpec, Lease
from agentruns.models import AgentRun
from agentruns.services import runs
from agentruns.services.runtime.results import SegmentResult
from agentruns.tools.shown import shown_turn
from agentruns.turns import APPROVAL, read_pending_turn
from agentruns.verdict_forms import (
    APPROVE_ALL,
    DECISIONS,
    DENY_ALL,
    CallForm,
    add_argument_errors,
    decision_arguments,
    turn_call_forms,
)
from playground import trace
from playground.forms import RunForm
from playground.pending import VERDICT_PREFIX, cancel_for, input_form_of, pending_context
from playground.stream import RunStream

PERMISSION = "playground.use_playground"
HISTORY_LENGTH = 20
VERDICTS_REFUSED = 422
NDJSON = "application/x-ndjson"


def may_use_playground(user: Any) -> bool:
    return bool(user.is_active and user.is_staff and user.has_perm(PERMISSION)) or bool(
        user.is_active and user.is_superuser
    )


playground_required = user_passes_test(may_use_playground, login_url="admin:login")


# --- Rendering helpers ---------------------------------------------------------------------------


def _outcome_html(
    request: HttpRequest,
    run: AgentRun,
    outcome: str = "",
    input_form: InputValuesForm | None = None,
    verdicts: list[CallForm] | None = None,
) -> str:
    return render_to_string(
        "playground/_outcome.html",
        {**pending_context(run, request.user, input_form, verdicts), "outcome": outcome},
        request=request,
    )


def _history(request: HttpRequest) -> list[dict[str, Any]]:
    """The reader's own latest runs, newest first."""
    history = selectors.run_list(user=request.user, initiator_id=request.user.pk)[:HISTORY_LENGTH]
    return [{"run": run, "timeline_url": trace.timeline_url(run)} for run in history]


def _history_html(request: HttpRequest) -> str:
    return render_to_string(
        "playground/_history.html", {"history": _history(request)}, request=request
    )


def _page(request: HttpRequest, form: RunForm, *, status: int = 200) -> HttpResponse:
    return render(
        request,
        "playground/index.html",
        {"form": form, "history": _history(request), "start": start_authority(request.user)},
        status=status,
    )


def _stream(request: HttpRequest, start: Callable[..., SegmentResult]) -> StreamingHttpResponse:
    def step_line(spec: EventSpec, run_uuid: str) -> dict[str, Any]:
        shown = {**spec.payload, **(spec.shown or {})}  # a request's dialogue, not stored
        actor = request.user.get_username() if spec.actor_id == request.user.pk else None
        ctx = trace.step(spec.kind, shown, duration_ms=spec.duration_ms, actor=actor)
        return {
            "run": run_uuid,
            "kind": spec.kind,
            "label": display.event_kind_label(spec.kind),
            "payload": shown,
            "duration_ms": spec.duration_ms,
            "html": trace.render_step(ctx),
        }

    zone = timezone.get_current_timezone()  # rendered later, after the middleware is done

    def end_line(result: SegmentResult) -> dict[str, Any]:
        with timezone.override(zone):
            return _end_line(result)

    def _end_line(result: SegmentResult) -> dict[str, Any]:
        run = result.run
        return {
            "run": str(run.uuid),
            "outcome": result.outcome,
            "outcome_label": display.lookup(display.SEGMENT_OUTCOMES, result.outcome),
            "status": run.status,
            "termination_reason": run.termination_reason,
            "output": run.output,
            "url": reverse("playground:run", args=[run.uuid]),
            "html": _outcome_html(request, run, result.outcome),
            "history_html": _history_html(request),
        }

    def error_line(exc: Exception) -> dict[str, Any]:
        if isinstance(exc, VerdictsRefused):
            with timezone.override(zone):
                return _verdicts_line(request, exc)
        if isinstance(exc, LeaseholdError):
            return exc.as_dict()
        return {"code": "internal_error", "message": "the run could not be streamed"}

    def heartbeat_line(lease: Lease, lease_expires: Any) -> dict[str, Any]:
        with timezone.override(zone):
            html = render_to_string(
                "playground/_heartbeat.html", {"until": lease_expires, "epoch": lease.epoch}
            )
        return {"run": str(lease.uuid), "lease_expires": lease_expires, "html": html}

    response = StreamingHttpResponse(
        RunStream(
            start,
            step_line=step_line,
            end_line=end_line,
            error_line=error_line,
            heartbeat_line=heartbeat_line,
        ),
        content_type=NDJSON,
    )
    response["X-Accel-Buffering"] = "no"
    response["Cache-Control"] = "no-cache"
    return response


def _stream_refused(
    exc: LeaseholdError, status: int | None = None, *, html: str | None = None
) -> JsonResponse:
    """A refusal before anything ran; ``html`` (optional) replaces the outcome (e.g. the input
    form again, with its errors and the values kept)."""
    body = {"event": "error", **exc.as_dict(), **({"html": html} if html is not None else {})}
    return JsonResponse(body, status=status or exc.status, content_type=NDJSON)


# --- Pages ---------------------------------------------------------------------------------------


@require_GET
@playground_required
def index(request: HttpRequest) -> HttpResponse:
    """The start form; ``?configuration=<slug>`` chooses a configuration in it."""
    chosen = request.GET.get("configuration")
    return _page(request, RunForm(initial={"configuration": chosen} if chosen else None))


@require_POST
@playground_required
def run_batch(request: HttpRequest) -> HttpResponse:
    """Run to the end (or a pause) in this request, then show the trace. Works without JS."""
    form = RunForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    try:
        runs.run_authorize_start(actor=request.user)
        result = runs.run_start_sync(initiator=request.user, **form.start_arguments())
    except LeaseholdError as exc:
        form.add_error(None, exc.message)
        return _page(request, form, status=exc.status)
    return redirect("playground:run", result.run.uuid)


@require_POST
@playground_required
def run_stream(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """The same run, streamed: NDJSON ``step`` lines as they are recorded, then one terminal."""
    try:
        runs.run_authorize_start(actor=request.user)
    except LeaseholdError as exc:
        return _stream_refused(exc)
    form = RunForm(request.POST)
    if not form.is_valid():
        return _stream_refused(
            InvalidRequest("the form is not valid", errors=form.errors.get_json_data())
        )
    return _stream(
        request,
        functools.partial(runs.run_start_sync, initiator=request.user, **form.start_arguments()),
    )


def _run_page(
    request: HttpRequest,
    run: AgentRun,
    *,
    input_form: InputValuesForm | None = None,
    verdicts: list[CallForm] | None = None,
    status: int = 200,
) -> HttpResponse:
    steps = trace.stored_steps(run, list(selectors.run_events(run=run)))
    return render(
        request,
        "playground/run.html",
        {
            **pending_context(run, request.user, input_form),
            "steps": [trace.render_step(s) for s in steps],
            "outcome_html": _outcome_html(request, run, input_form=input_form, verdicts=verdicts),
        },
        status=status,
    )


@require_GET
@playground_required
def run_detail(request: HttpRequest, uuid: str) -> HttpResponse:
    try:
        run = selectors.run_get(run_uuid=uuid, user=request.user)
    except RunNotFound as exc:
        raise Http404(exc.message) from exc
    return _run_page(request, run)


class VerdictsRefused(Exception):
    """The posted verdicts (or an edit the tool's schema refused) come back on the card."""

    words = "Nothing was decided: a verdict needs correcting (each problem is said on its call)."

    def __init__(self, run: AgentRun, forms: list[CallForm]) -> None:
        super().__init__("verdicts refused")
        self.run, self.forms = run, forms


def _decide_start(request: HttpRequest, uuid: str) -> Callable[..., SegmentResult]:
    """``run_decide`` for what the card posted: *Approve all*, *Deny all* (with the reasons
    typed on its calls), or a verdict per call. ``VerdictsRefused`` when a form has a problem."""
    decision = request.POST.get("decision") or {"1": APPROVE_ALL, "0": DENY_ALL}.get(
        request.POST.get("approved") or "", ""
    )
    if decision not in DECISIONS:
        raise InvalidRequest("decision must be approve, deny or calls", field="decision")
    run = selectors.run_get(run_uuid=uuid, user=request.user)
    pending = shown_turn(run, read_pending_turn(run))
    forms: list[CallForm] = []
    if pending.kind == APPROVAL:
        forms = turn_call_forms(
            run=run,
            pending=pending,
            reader=Decider(request.user),
            prefix=VERDICT_PREFIX,
            data=request.POST,
        )
    arguments = (
        decision_arguments(decision, forms) if forms else {"approved": decision == APPROVE_ALL}
    )
    if arguments is None:
        raise VerdictsRefused(run, forms)

    def start(**options: Any) -> SegmentResult:
        try:
            return runs.run_decide(
                run_uuid=uuid,
                actor=request.user,
                turn_digest=request.POST.get("turn_digest") or None,
                mode="inline",
                **arguments,
                **options,
            )
        except InvalidArguments as exc:
            add_argument_errors(forms, call_id=str(exc.detail.get("call_id")), errors=exc.errors)
            raise VerdictsRefused(run, forms) from exc

    return start


def _posted_input(request: HttpRequest, uuid: str) -> tuple[AgentRun, InputValuesForm | None]:
    """The run and its input form bound to the POST; no form when the run's pending turn is not
    a readable input turn (the service then says why it refuses)."""
    run = selectors.run_get(run_uuid=uuid, user=request.user)
    spec, form, _ = input_form_of(run, request.POST)
    if spec is not None and form is None:
        raise InvalidRequest("This input cannot be given here: " + " ".join(spec.blocking))
    return run, form


def _submit_input(
    request: HttpRequest, uuid: str, values: dict[str, Any]
) -> Callable[..., SegmentResult]:
    return functools.partial(
        runs.run_submit_input,
        run_uuid=uuid,
        actor=request.user,
        values=values,
        turn_digest=request.POST.get("turn_digest") or None,
        mode="inline",
    )


def _batch_continue(
    request: HttpRequest, uuid: str, build: Callable[[HttpRequest, str], Callable[..., Any]]
) -> HttpResponse:
    try:
        build(request, uuid)()
    except VerdictsRefused as exc:
        return _run_page(request, exc.run, verdicts=exc.forms, status=VERDICTS_REFUSED)
    except LeaseholdError as exc:
        messages.error(request, exc.message)
    # Back on the run, the focus on where it stands now (``decided``: the page autofocuses it).
    return HttpResponseRedirect(reverse("playground:run", args=[uuid]) + "?decided=1#outcome")


def _verdicts_line(request: HttpRequest, exc: VerdictsRefused) -> dict[str, Any]:
    """The card again, its problems said on each call (the page shows them once)."""
    return {
        "code": "verdicts_refused",
        "message": VerdictsRefused.words,
        "html": _outcome_html(request, exc.run, verdicts=exc.forms),
    }


def _stream_continue(
    request: HttpRequest, uuid: str, build: Callable[[HttpRequest, str], Callable[..., Any]]
) -> HttpResponse | StreamingHttpResponse:
    try:
        start = build(request, uuid)
    except VerdictsRefused as exc:
        line = {"event": "error", **_verdicts_line(request, exc)}
        return JsonResponse(line, status=VERDICTS_REFUSED, content_type=NDJSON)
    except LeaseholdError as exc:
        return _stream_refused(exc)
    return _stream(request, start)


@require_POST
@playground_required
def decide(request: HttpRequest, uuid: str) -> HttpResponse:
    """Approve or deny the pending turn and continue inline; then show the trace."""
    return _batch_continue(request, uuid, _decide_start)


@require_POST
@playground_required
def decide_stream(request: HttpRequest, uuid: str) -> HttpResponse | StreamingHttpResponse:
    """Approve or deny, and stream the inline continuation."""
    return _stream_continue(request, uuid, _decide_start)


@require_POST
@playground_required
def submit_input(request: HttpRequest, uuid: str) -> HttpResponse:
    """Supply the values and continue inline; invalid values re-render the run (422) with the
    form's errors and the values kept."""
    try:
        run, form = _posted_input(request, uuid)
    except LeaseholdError as exc:
        messages.error(request, exc.message)
        return redirect("playground:run", uuid)
    if form is None:
        return _batch_continue(request, uuid, lambda r, u: _submit_input(r, u, {}))
    if form.is_valid():
        try:
            _submit_input(request, uuid, form.values())()
        except InvalidInput as exc:
            form.add_schema_errors(exc.errors)
        except LeaseholdError as exc:
            messages.error(request, exc.message)
            return redirect("playground:run", uuid)
        else:
            return redirect("playground:run", uuid)
    return _run_page(request, run, input_form=form, status=InvalidInput.status)


@require_POST
@playground_required
def submit_input_stream(request: HttpRequest, uuid: str) -> HttpResponse | StreamingHttpResponse:
    """Supply the values and stream the continuation; values the form refuses are an error line
    carrying the form again with its errors."""
    try:
        run, form = _posted_input(request, uuid)
    except LeaseholdError as exc:
        return _stream_refused(exc)
    if form is not None and not form.is_valid():
        return _stream_refused(
            InvalidInput(errors=form.problems()),
            html=_outcome_html(request, run, input_form=form),
        )
    return _stream(request, _submit_input(request, uuid, form.values() if form else {}))


@require_http_methods(["GET", "POST"])
@playground_required
def cancel(request: HttpRequest, uuid: str) -> HttpResponse:
    """*Cancel run*. GET: the confirmation step; POST (CSRF): ``runs.run_cancel`` under its
    rules and guarded write, then back to the run's trace with what happened."""
    try:
        run = selectors.run_get(run_uuid=uuid, user=request.user)
    except RunNotFound as exc:
        raise Http404(exc.message) from exc
    if request.method == "GET":
        return render(
            request, "playground/cancel.html", {"run": run, "cancel": cancel_for(run, request.user)}
        )
    try:
        cancelled = runs.run_cancel(
            run_uuid=uuid, actor=request.user, note="cancelled in the playground"
        )
    except LeaseholdError as exc:
        messages.error(request, f"Not cancelled: {exc.message}")
    else:
        if cancelled:
            messages.success(request, "Run cancelled.")
        else:
            run.refresh_from_db(fields=["status"])
            messages.warning(
                request,
                f"Nothing was cancelled: the run had already ended ({run.get_status_display()}).",
            )
    return redirect("playground:run", uuid)
