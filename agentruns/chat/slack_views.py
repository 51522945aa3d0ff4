"""Slack's interactivity endpoint (``POST integrations/slack/interactivity/``): Slack posts here
when someone presses a button of a Leasehold message.

``csrf_exempt`` only because Slack cannot hold a CSRF token: every request must instead carry
Slack's signature of its body and a timestamp within five minutes (``slack_requests``), checked
before anything is read. Answers 404 while no signing secret is configured (the integration is
off), 401 to an unsigned, badly signed or stale request, 400 to a body that is not a button
press; otherwise the press is handed to ``services.chat_decisions`` (which replies through
Slack's ``response_url``) and Slack gets an empty 200. POST only: a GET never decides.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agentruns.chat.slack_requests import (
    MAX_BODY_BYTES,
    parse_action,
    signed_by_slack,
    signing_secret,
)
from agentruns.services.chat_decisions import slack_action_handle


@csrf_exempt  # signature-verified instead: Slack signs every request with the app's secret
@require_POST
def interactivity(request: HttpRequest) -> HttpResponse:
    secret = signing_secret()
    if secret is None:
        return HttpResponse("Slack interactivity is not configured.", status=404)
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        return HttpResponse("The request is too large.", status=413)
    body = request.body
    if not signed_by_slack(secret, body, request.headers):
        return HttpResponse("The request is not signed by Slack (or is too old).", status=401)
    action = parse_action(body)
    if action is None:
        return HttpResponse("Not a button press Leasehold reads.", status=400)
    slack_action_handle(action=action)
    return HttpResponse(status=200)
