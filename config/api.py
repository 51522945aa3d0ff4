"""The API's one exception handler: Leasehold refusals and DRF errors as ``{"code", "message"}``.

Every refusal an API client can meet comes out in one shape: ``code`` (stable, machine-readable),
``message`` (for people) and optional details (``errors`` for malformed requests, the refusal's
own fields for Leasehold refusals).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from agentruns.exceptions import LeaseholdError
from config.errors import RETRY_AFTER_SECONDS, UNAVAILABLE, database_unavailable

logger = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, LeaseholdError):
        return Response(exc.as_dict(), status=exc.status)
    if database_unavailable(exc):  # a restart: nothing was changed, try again
        return Response(
            dict(UNAVAILABLE), status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )
    if isinstance(exc, RequestDataTooBig):
        return Response(
            {
                "code": "request_too_large",
                "message": f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} "
                "bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); nothing was read.",
            },
            status=413,
        )
    # DRF turns these two Django exceptions into its own; do it first so they get the shape too.
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:  # not a refusal: a bug or an outage. Logged, never shown.
        logger.exception("API: unexpected %s", type(exc).__name__, exc_info=exc)
        return Response(
            {"code": "internal_error", "message": "An unexpected error occurred; it was logged."},
            status=500,
        )
    if isinstance(exc, drf_exceptions.ValidationError):
        response.data = {
            "code": "invalid_request",
            "message": "The request is malformed.",
            "errors": response.data,
        }
    elif isinstance(exc, drf_exceptions.APIException):
        detail = response.data.get("detail") if isinstance(response.data, dict) else None
        response.data = {
            "code": getattr(detail, "code", None) or exc.default_code,
            "message": str(detail or exc.detail),
        }
    return response
