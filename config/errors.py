"""The project's answer to an unexpected error: 503 while the database is unreachable, else
Django's 500.

A database restart (or failover) makes every request that needs the database fail until the
server accepts connections again: the connection a request held is dead, and a new one is
refused. Those requests answer **503** with ``Retry-After``, not 500 — the API in its own
``{"code", "message"}`` shape (``config.api``), pages with a short text — and the next request
after the restart opens a new connection (``close_old_connections`` at each request; with
``DATABASE_CONN_MAX_AGE`` above 0 the health check replaces a dead persistent connection before
it is used). Nothing was written by a refused request: a state write that fails rolls back.
"""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

#: Seconds a client is asked to wait before trying again.
RETRY_AFTER_SECONDS = 5
UNAVAILABLE = {
    "code": "database_unavailable",
    "message": "The database is unavailable (restarting?); nothing was changed. Try again shortly.",
}


def database_unavailable(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the database could not be reached or the connection died (not a
    refused statement: an integrity or data error is the request's own)."""
    return isinstance(exc, (OperationalError, InterfaceError))


def unavailable_response(request: HttpRequest) -> HttpResponse:
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse(UNAVAILABLE, status=503)
    else:
        response = HttpResponse(
            UNAVAILABLE["message"], status=503, content_type="text/plain; charset=utf-8"
        )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: called while the uncaught exception is being handled."""
    if database_unavailable(sys.exc_info()[1]):
        return unavailable_response(request)
    return defaults.server_error(request)
