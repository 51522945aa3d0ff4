"""The dashboard page: staff who may see every run (``selectors.sees_every_run``), checked on
every request; the admin's ``admin_view`` (mounted by ``AgentRunAdmin.get_urls``) sends anyone
else to the admin login first. A staff member without the permission gets 403.
"""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from agentruns import selectors
from agentruns.dashboard.charts import draw_all
from agentruns.models import AgentRun


def dashboard(request: HttpRequest, *, admin_site: AdminSite) -> HttpResponse:
    if not (request.user.is_active and request.user.is_staff):
        raise PermissionDenied
    if not selectors.sees_every_run(request.user):
        raise PermissionDenied("the dashboard counts every run: it needs permission to see them")
    return TemplateResponse(
        request,
        "admin/agentruns/dashboard.html",
        {
            **admin_site.each_context(request),
            "title": "Operations dashboard",
            "opts": AgentRun._meta,
            "charts": draw_all(),
            "is_nav_sidebar_enabled": False,  # the charts take the width
        },
    )
