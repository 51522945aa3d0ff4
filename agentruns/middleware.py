"""The time zone a request's pages show times in (docs/design.md §11.3): the user's own when their
user model has a ``time_zone`` attribute naming one (a project's custom user model), else
``settings.TIME_ZONE``. Every screen names the zone it shows (``{% time_zone_name %}``).

Add ``"agentruns.middleware.TimeZoneMiddleware"`` after ``AuthenticationMiddleware``. A zone
name that is not a known IANA zone is ignored (the default is shown), never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.http import HttpRequest, HttpResponse
from django.utils import timezone


def user_time_zone(user: Any) -> ZoneInfo | None:
    """The zone ``user`` has set (their ``time_zone`` attribute), or ``None``."""
    name = getattr(user, "time_zone", None) if getattr(user, "is_authenticated", False) else None
    if not isinstance(name, str) or not name.strip():
        return None
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        return None


class TimeZoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        zone = user_time_zone(getattr(request, "user", None))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
