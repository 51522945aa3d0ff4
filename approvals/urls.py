"""The inbox's URLs, mounted at ``/admin/approvals/`` (before the admin's own catch-all).

Every view goes through ``admin.site.admin_view`` (staff only, CSRF, never cached; anyone else
is redirected to the admin login) and ``decider_required`` (``agentruns.decide_agentrun``).
"""

from django.contrib import admin
from django.urls import path

from approvals import decision_views, views

app_name = "approvals"


def _staff(view: views.View) -> views.View:
    return admin.site.admin_view(views.decider_required(view))


urlpatterns = [
    path("", _staff(views.inbox), name="inbox"),
    path("runs/", _staff(views.recent), name="recent"),
    path("runs/<uuid:run_uuid>/", _staff(views.run_detail), name="run"),
    path("runs/<uuid:run_uuid>/audit.jsonl", _staff(views.run_audit), name="run-audit"),
    path("decisions/", _staff(decision_views.decide_batch), name="decide-batch"),
    path("runs/<uuid:run_uuid>/decision/", _staff(decision_views.decide), name="decide"),
    path("runs/<uuid:run_uuid>/input/", _staff(decision_views.submit_input), name="input"),
    path(
        "runs/<uuid:run_uuid>/reconciliation/",
        _staff(decision_views.reconcile),
        name="reconcile",
    ),
    path("runs/<uuid:run_uuid>/review/<str:token>/", _staff(views.review), name="review"),
    path("runs/<uuid:run_uuid>/cancel/", _staff(views.cancel), name="cancel"),
]
