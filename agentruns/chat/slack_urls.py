"""Slack's routes, for a project to mount: ``path("integrations/slack/",
include("agentruns.chat.slack_urls"))`` gives ``/integrations/slack/interactivity/``, the
Request URL of the Slack app's Interactivity setting."""

from django.urls import path

from agentruns.chat import slack_views

app_name = "slack"

urlpatterns = [
    path("interactivity/", slack_views.interactivity, name="interactivity"),
]
