"""A request from Slack's interactivity, checked and read: its signature and timestamp verified by
the official ``slack_sdk`` (``SignatureVerifier``: HMAC-SHA256 of ``v0:<timestamp>:<body>``
under the app's signing secret, and a timestamp within five minutes of now, so a recorded
request cannot be replayed later), then its ``payload`` parsed into a ``SlackAction`` — the one
place that reads Slack's JSON.

The signing secret is read from the environment variable ``SIGNING_SECRET_ENV``
(``LEASEHOLD_SLACK_SIGNING_SECRET``) through ``agentruns.secrets``: unset, empty, or a name the
``SECRET_ENV_PREFIXES`` rule refuses means the endpoint is off. Never puts the secret in a
message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from slack_sdk.signature import SignatureVerifier

from agentruns.exceptions import SecretEnvRefused
from agentruns.secrets import read_secret_env

SIGNING_SECRET_ENV = "LEASEHOLD_SLACK_SIGNING_SECRET"
#: The most of a request body read (Slack's payloads are far smaller).
MAX_BODY_BYTES = 256 * 1024
_DECISION_VALUE = re.compile(r"([0-9a-f-]{36}):([0-9a-f]{64})")


def signing_secret() -> str | None:
    """The Slack app's signing secret, or ``None`` when interactivity is off (unset, blank, or
    its variable refused by the secret rule)."""
    try:
        secret = read_secret_env(SIGNING_SECRET_ENV, what="Slack interactivity")
    except SecretEnvRefused:
        return None
    return secret if secret and secret.strip() else None


def signed_by_slack(secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
    """Whether ``body`` with ``headers`` (``X-Slack-Signature``, ``X-Slack-Request-Timestamp``)
    was signed with ``secret`` within the last five minutes (``SignatureVerifier``)."""
    try:
        return SignatureVerifier(secret).is_valid_request(body, dict(headers))
    except (ValueError, UnicodeDecodeError):  # a timestamp that is no number, a body not UTF-8
        return False


@dataclass(frozen=True)
class SlackAction:
    """One button press (a ``block_actions`` payload's first action)."""

    slack_user_id: str
    slack_user_name: str
    action_id: str
    value: str
    response_url: str
    message_blocks: list[Any] | None

    @property
    def decision(self) -> tuple[str, str] | None:
        """``(run uuid, turn digest)`` when the value is an Approve or Deny button's."""
        matched = _DECISION_VALUE.fullmatch(self.value)
        return (matched.group(1), matched.group(2)) if matched else None


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def parse_action(body: bytes) -> SlackAction | None:
    """The button press a verified ``application/x-www-form-urlencoded`` body carries, or
    ``None`` when it carries none Leasehold reads (another payload type, no action, bad JSON)."""
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(fields.get("payload", [""])[0])
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    user, actions = payload.get("user"), payload.get("actions")
    if not isinstance(user, dict) or not isinstance(actions, list) or not actions:
        return None
    action = actions[0]
    if not isinstance(action, dict):
        return None
    message = payload.get("message")
    blocks = message.get("blocks") if isinstance(message, dict) else None
    return SlackAction(
        slack_user_id=_text(user, "id"),
        slack_user_name=_text(user, "username") or _text(user, "name"),
        action_id=_text(action, "action_id"),
        value=_text(action, "value"),
        response_url=_text(payload, "response_url"),
        message_blocks=blocks if isinstance(blocks, list) else None,
    )
