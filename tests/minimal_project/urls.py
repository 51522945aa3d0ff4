from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    # The approvals inbox lives inside the admin; it must precede the admin's catch-all.
    path("admin/approvals/", include("approvals.urls")),
    path("admin/", admin.site.urls),
]
