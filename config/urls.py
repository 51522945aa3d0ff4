from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from agentruns.metrics import metrics_view
from config.front_door import front_door


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


# 503 while the database is unreachable (a restart), else Django's 500 (config/errors.py).
handler500 = "config.errors.server_error"

# "View site" in the admin's header goes to the front door (config.front_door).
admin.site.site_url = "/"

urlpatterns = [
    path("", front_door, name="front-door"),
    # Browsers ask every site for /favicon.ico (the admin's pages name none).
    path("favicon.ico", RedirectView.as_view(url=static("agentruns/favicon.ico"), permanent=True)),
    # The approvals inbox lives inside the admin; it must precede the admin's catch-all.
    path("admin/approvals/", include("approvals.urls")),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/", include("agentruns.api.urls")),
    path("playground/", include("playground.urls")),
    # Slack's interactivity (README "Deciding from email and Slack"): off without its secret.
    path("integrations/slack/", include("agentruns.chat.slack_urls")),
]
