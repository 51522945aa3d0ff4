"""``POST /api/events/<slug>/``: a signed event from another system (docs/schedules_and_events.md).

Authenticated by its signature, not by a session or token: no user signs in, so the view has no
authentication classes and reads the raw body (the signature covers its exact bytes). It calls
``services.events.event_receive`` and renders its outcome; every refusal is a typed
``agentruns.exceptions`` class, mapped to HTTP by the API's one exception handler.
"""

from __future__ import annotations

from django.http import HttpRequest
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agentruns import event_requests
from agentruns.api import serializers as s
from agentruns.exceptions import EventTooLarge
from agentruns.services import events


class EventOutcomeSerializer(serializers.Serializer):
    event = serializers.CharField(help_text="The event's id.")
    action = serializers.ChoiceField(choices=["started", "input"])
    run = serializers.UUIDField(help_text="The run the event started or gave input to.")
    replayed = serializers.BooleanField(
        help_text="true: an earlier delivery of this event did it; nothing was done again."
    )


EventBodySerializer = inline_serializer(
    "EventBody",
    {
        "id": serializers.CharField(max_length=200, help_text="Unique per configuration."),
        "correlation_key": serializers.CharField(
            max_length=200,
            required=False,
            help_text="Starting: remembered with the run. With input: the run to deliver to.",
        ),
        "data": serializers.JSONField(
            required=False, help_text="Starting: the event, put in the run's prompt as data."
        ),
        "input": serializers.DictField(
            required=False, help_text="The values the correlated run waits for."
        ),
    },
)

_HEADERS = [
    OpenApiParameter(
        event_requests.TIMESTAMP_HEADER,
        OpenApiTypes.STR,
        OpenApiParameter.HEADER,
        required=True,
        description="Unix seconds; within 300 s of the server's clock.",
    ),
    OpenApiParameter(
        event_requests.SIGNATURE_HEADER,
        OpenApiTypes.STR,
        OpenApiParameter.HEADER,
        required=True,
        description='"v1=" + hex HMAC-SHA256 of "v1:{timestamp}:{body}" under the secret.',
    ),
    OpenApiParameter("slug", OpenApiTypes.STR, OpenApiParameter.PATH),
]


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(s.ErrorSerializer, description=description)


class EventView(APIView):
    authentication_classes: list[type] = []  # the signature authenticates (event_requests)
    permission_classes = [AllowAny]
    parser_classes: list[type] = []  # the raw body is read: the signature covers its bytes

    @extend_schema(
        operation_id="events_receive",
        auth=[],
        parameters=_HEADERS,
        request=EventBodySerializer,
        responses={
            200: OpenApiResponse(EventOutcomeSerializer, description="A replay: nothing done."),
            202: OpenApiResponse(EventOutcomeSerializer, description="Started or delivered."),
            400: _error("invalid_request: the body is not an event (naming the field)."),
            401: _error("bad_signature: missing or wrong signature, or a stale timestamp."),
            403: _error("not_permitted: the account events act as may not do this."),
            404: _error("event_source_not_found, or correlation_key_unknown, or run_not_found."),
            409: _error(
                "event_id_reused, correlation_key_taken, not_waiting, stale_turn, "
                "unreadable_state, approval_expired."
            ),
            413: _error("request_too_large: over 256 KiB."),
            422: OpenApiResponse(s.InvalidInputSerializer, description="invalid_input."),
        },
        description="A signed event from another system (not a session or token: the "
        "configuration's secret signs it). Without input: starts a queued run of the "
        "configuration with the event's data in its prompt (202). With correlation_key and "
        "input: delivers the input to the run started with that key, which must wait for "
        "input (202; the values are checked against its input schema, 422 and the run keeps "
        "waiting). Idempotent per id: a replay answers 200 with the same run.",
    )
    def post(self, request: Request, slug: str) -> Response:
        django_request: HttpRequest = request._request
        if _declared_length(django_request) > event_requests.MAX_BODY_BYTES:
            raise EventTooLarge()
        body = django_request.body
        if len(body) > event_requests.MAX_BODY_BYTES:
            raise EventTooLarge()
        outcome = events.event_receive(
            slug=slug,
            body=body,
            timestamp=request.headers.get(event_requests.TIMESTAMP_HEADER),
            signed=request.headers.get(event_requests.SIGNATURE_HEADER),
        )
        data = {
            "event": outcome.event_id,
            "action": outcome.action,
            "run": outcome.run_uuid,
            "replayed": outcome.replayed,
        }
        answer = status.HTTP_200_OK if outcome.replayed else status.HTTP_202_ACCEPTED
        return Response(EventOutcomeSerializer(data).data, status=answer)


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0
