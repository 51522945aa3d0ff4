"""Routes of the API under ``/api/`` (included by ``config.urls``).

The schema and its docs pages (Swagger UI, Redoc; assets served from our own static files by
``drf-spectacular-sidecar``) need a staff user like every other endpoint.
"""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from agentruns.api import events, views

app_name = "api"

_STAFF = {
    "authentication_classes": views.LeaseholdAPIView.authentication_classes,
    "permission_classes": views.LeaseholdAPIView.permission_classes,
}

urlpatterns = [
    path("runs/", views.RunsView.as_view(), name="runs"),
    path("runs/<str:uuid>/", views.RunDetailView.as_view(), name="run"),
    path("runs/<str:uuid>/events/", views.RunEventsView.as_view(), name="run-events"),
    path("runs/<str:uuid>/decision/", views.RunDecisionView.as_view(), name="run-decision"),
    path("runs/<str:uuid>/input/", views.RunInputView.as_view(), name="run-input"),
    path(
        "runs/<str:uuid>/reconciliation/",
        views.RunReconciliationView.as_view(),
        name="run-reconciliation",
    ),
    path("runs/<str:uuid>/cancel/", views.RunCancelView.as_view(), name="run-cancel"),
    path("runs/<str:uuid>/audit/", views.RunAuditView.as_view(), name="run-audit"),
    # Signed by the sender, not a session or token (agentruns.api.events).
    path("events/<str:slug>/", events.EventView.as_view(), name="events"),
    path("schema/", SpectacularAPIView.as_view(**_STAFF), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema", **_STAFF), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema", **_STAFF), name="redoc"),
]
