"""Routes of the playground under ``/playground/`` (included by ``config.urls``)."""

from django.urls import path

from playground import views

app_name = "playground"

urlpatterns = [
    path("", views.index, name="index"),
    path("run/", views.run_batch, name="run-batch"),
    path("stream/", views.run_stream, name="run-stream"),
    path("runs/<uuid:uuid>/", views.run_detail, name="run"),
    path("runs/<uuid:uuid>/decision/", views.decide, name="decide"),
    path("runs/<uuid:uuid>/decision/stream/", views.decide_stream, name="decide-stream"),
    path("runs/<uuid:uuid>/input/", views.submit_input, name="input"),
    path("runs/<uuid:uuid>/input/stream/", views.submit_input_stream, name="input-stream"),
    path("runs/<uuid:uuid>/cancel/", views.cancel, name="cancel"),
]
