"""API views: parse, call one service or selector, render (docs/design.md §11.2).

Every endpoint needs an authenticated staff user (token or session). A run the user may not see
(docs/design.md §12.1: not started by them, and they hold neither ``agentruns.decide_agentrun``
nor ``agentruns.view_all_agentruns``) is not listed and answers 404 like a missing one. Deciding
and cancelling are checked by the services themselves (``NotPermitted``, naming what is missing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentruns import audit, selectors
from agentruns.api import decision_bodies as bodies
from agentruns.api import serializers as s
from agentruns.api.parsers import StrictJSONParser
from agentruns.services import runs
from agentruns.services.runtime.results import Outcome, SegmentResult
from agentruns.tools.schemas import MAX_REPORTED_ERRORS

UUID_PARAMETER = OpenApiParameter("uuid", OpenApiTypes.UUID, OpenApiParameter.PATH)


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: OpenApiResponse(s.ErrorSerializer) for code in (401, 403, *codes)}


class LeaseholdAPIView(APIView):
    # Token first: an unauthenticated request gets 401 with ``WWW-Authenticate: Token``.
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAdminUser]
    parser_classes = [StrictJSONParser]


def _parse(serializer_class: type[s.serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _continued(result: SegmentResult) -> Response:
    """A decision's answer: 202 when handed to a worker, else 200 with the run after it."""
    if result.outcome == Outcome.QUEUED:
        return Response(s.RunQueuedSerializer(result.run).data, status=status.HTTP_202_ACCEPTED)
    return Response(s.RunSerializer(result.run).data)


class RunPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = s.MAX_PAGE_SIZE

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        # ``page`` and ``page_size`` are documented (and checked) by ``RunFilterSerializer``.
        return []


class RunsView(LeaseholdAPIView, GenericAPIView):
    serializer_class = s.RunSerializer
    pagination_class = RunPagination

    @extend_schema(
        operation_id="runs_list",
        parameters=[s.RunFilterSerializer],
        responses={200: s.RunSummarySerializer(many=True), **_errors(400, 404)},
        description="Newest first, paginated (?page=N, ?page_size=N up to 200; 404 for a page "
        "past the last). Prompts and "
        "outputs are cut at 500 characters (prompt_truncated, output_truncated); the run's "
        "detail has them whole, and its pending turn.",
    )
    def get(self, request: Request) -> Response:
        filters = _parse(s.RunFilterSerializer, request.query_params)
        queryset = selectors.run_list(
            user=request.user,
            status=filters.get("status"),
            configuration=filters.get("configuration"),
        )
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(s.RunSummarySerializer(page, many=True).data)

    @extend_schema(
        operation_id="runs_start",
        request=s.RunStartSerializer,
        responses={200: s.RunSerializer, 202: s.RunQueuedSerializer, **_errors(400)},
        description="Needs agentruns.start_agentrun (403 not_permitted otherwise). "
        "sync: runs until the run pauses or ends, answers 200 with the run. "
        "queued: inserts a queued run for a worker, answers 202.",
    )
    def post(self, request: Request) -> Response:
        runs.run_authorize_start(actor=request.user)
        data = _parse(s.RunStartSerializer, request.data)
        options = {"script": data["script"]} if data.get("script") is not None else None
        arguments = {
            "configuration": data["configuration"],
            "prompt": data["prompt"],
            "initiator": request.user,
            "options": options,
        }
        if data["mode"] == "queued":
            run = runs.run_enqueue(**arguments)
            return Response(s.RunQueuedSerializer(run).data, status=status.HTTP_202_ACCEPTED)
        result = runs.run_start_sync(**arguments)
        return Response(s.RunSerializer(result.run).data)


class RunDetailView(LeaseholdAPIView):
    @extend_schema(
        operation_id="runs_retrieve",
        parameters=[UUID_PARAMETER],
        responses={200: s.RunSerializer, **_errors(404)},
    )
    def get(self, request: Request, uuid: str) -> Response:
        return Response(s.RunSerializer(selectors.run_get(run_uuid=uuid, user=request.user)).data)


class RunEventsView(LeaseholdAPIView):
    @extend_schema(
        operation_id="runs_events",
        parameters=[UUID_PARAMETER, s.EventsQuerySerializer],
        responses={200: s.EventSerializer(many=True), **_errors(400, 404)},
        description=f"Events with sequence > after, in order, at most {s.EVENTS_LIMIT}; "
        "ask again with the last sequence for more.",
    )
    def get(self, request: Request, uuid: str) -> Response:
        query = _parse(s.EventsQuerySerializer, request.query_params)
        run = selectors.run_get(run_uuid=uuid, user=request.user)
        events = selectors.run_events(run=run, after=query["after"])[: s.EVENTS_LIMIT]
        return Response(s.EventSerializer(events, many=True).data)


_DECISION_RESPONSES = {
    200: s.RunSerializer,
    202: s.RunQueuedSerializer,
    **_errors(400, 404, 409),
}


class DecisionView(LeaseholdAPIView):
    """A decision endpoint: parse the body with ``serializer``, call ``service`` with the run's
    uuid, the user and the parsed fields (the serializer's fields are the service's keyword
    arguments), answer 202 when a worker continues, else 200 with the run after it."""

    serializer: type[s.serializers.Serializer]
    service: Callable[..., SegmentResult]

    def post(self, request: Request, uuid: str) -> Response:
        data = _parse(self.serializer, request.data)
        return _continued(self.service(run_uuid=uuid, actor=request.user, **data))


@extend_schema_view(
    post=extend_schema(
        operation_id="runs_decide",
        parameters=[UUID_PARAMETER],
        request=bodies.DecisionSerializer,
        responses={**_DECISION_RESPONSES, 422: OpenApiResponse(s.InvalidInputSerializer)},
        description="Decide the pending turn: the whole turn ({approved, reason?}: every open "
        "call alike; a denial's reason reaches the model as the reviewer's words) or each call "
        "({calls: [{id, verdict: approve|deny|answer|edit, reason?, answer?, arguments?}]}, "
        "every open call named once). An edit runs nothing: the run waits on a new card for "
        "the edited turn. inline: 200 with the run after the continuation; queued: 202. "
        "400: malformed (invalid_request naming the field), calls_mismatch (a call missing, "
        "named twice or not open), value_too_long (a reason over 2,000 or an answer over "
        "20,000 characters). 422 invalid_arguments: an edit breaks the tool's schema (field "
        "names the first field at fault). 409: stale or missing digest, already decided, not "
        "waiting, or unreadable_state (the stored turn does not match its digest: it can only "
        "be cancelled). 403: not permitted (deciding needs agentruns.decide_agentrun; "
        "approving, answering or editing a call also its approve_permission and the "
        "configuration's approver group — the message names what is missing, call_ids which "
        "calls), or self-approval under four-eyes (the run's initiator, or the person who "
        "edited a call, may not approve it).",
    )
)
class RunDecisionView(DecisionView):
    serializer = bodies.DecisionSerializer
    service = staticmethod(runs.run_decide)


@extend_schema_view(
    post=extend_schema(
        operation_id="runs_input",
        parameters=[UUID_PARAMETER],
        request=bodies.InputSerializer,
        responses={**_DECISION_RESPONSES, 422: OpenApiResponse(s.InvalidInputSerializer)},
        description="Supply the values a tool asked a human for; 422 when they do not match "
        "the pending input schema (nothing changes), with errors: [{path, message}] sorted by "
        f"path, at most {MAX_REPORTED_ERRORS} and then one entry at path [] saying how many "
        "more were found.",
    )
)
class RunInputView(DecisionView):
    serializer = bodies.InputSerializer
    service = staticmethod(runs.run_submit_input)


@extend_schema_view(
    post=extend_schema(
        operation_id="runs_reconcile",
        parameters=[UUID_PARAMETER],
        request=bodies.ReconciliationSerializer,
        responses=_DECISION_RESPONSES,
        description="Resolve an in-doubt write: landed, not_landed (the run continues) or "
        "abandon (settled failed / reconciled_abandoned). landed and not_landed need what "
        "approving the call needs (403 not_permitted names what is missing); abandon needs "
        "agentruns.decide_agentrun only.",
    )
)
class RunReconciliationView(DecisionView):
    serializer = bodies.ReconciliationSerializer
    service = staticmethod(runs.run_reconcile)


class RunCancelView(LeaseholdAPIView):
    @extend_schema(
        operation_id="runs_cancel",
        parameters=[UUID_PARAMETER],
        request=None,
        responses={200: s.CancelledSerializer, **_errors(404)},
        description="cancelled is false when the run had already ended. The initiator may "
        "cancel their own run; anyone else needs agentruns.cancel_agentrun, and a run waiting "
        "for reconciliation also needs agentruns.decide_agentrun (403 not_permitted).",
    )
    def post(self, request: Request, uuid: str) -> Response:
        cancelled = runs.run_cancel(run_uuid=uuid, actor=request.user, note="cancelled via API")
        return Response({"cancelled": cancelled})


AUDIT_MEDIA_TYPE = "application/jsonl"


class RunAuditView(LeaseholdAPIView):
    @extend_schema(
        operation_id="runs_audit",
        parameters=[UUID_PARAMETER],
        responses={
            (200, AUDIT_MEDIA_TYPE): OpenApiResponse(
                OpenApiTypes.STR,
                description="JSON Lines: a run line {type: run, format, run, status, head, "
                "events}, then one event line per event {type: event, run, sequence, kind, "
                "payload, segment, lease_epoch, actor, prev_hash, hash, duration_ms, "
                "created_at, v, key} up to the event the head names.",
            ),
            **_errors(404),
        },
        description="The run's audit trail, streamed as JSON Lines: every event with the hash "
        "chain that proves it (each hash is SHA-256 — HMAC-SHA256 under the ledger's key when "
        "one is configured — over the previous hash and the canonical JSON of every field the "
        "event stores; the README shows a standalone script that verifies a file).",
    )
    def get(self, request: Request, uuid: str) -> StreamingHttpResponse:
        run = selectors.run_get(run_uuid=uuid, user=request.user)
        response = StreamingHttpResponse(audit.export_lines(run), content_type=AUDIT_MEDIA_TYPE)
        response["Content-Disposition"] = f'attachment; filename="{audit.export_filename(run)}"'
        return response
