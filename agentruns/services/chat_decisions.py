"""Deciding from chat (README "Deciding from email and Slack"): a Slack button press, verified by
``agentruns.chat.slack_requests``, becomes a decision of the Django account its Slack user is
linked to (``SlackUser``), through ``decisions.run_decide`` — the same authority, four-eyes and
deadline rules as every interface, checked under the row lock — and a reply that updates the
Slack message.

* **Who**: the press's Slack user id must be linked to an active staff account (as every
  Leasehold screen requires staff); else it is refused (``ChatUserUnknown``, ``NotPermitted``)
  and the reply says so.
* **Approve** also needs ``authority.chat_approval_problem`` to find nothing: the configuration
  allows approving from chat and no preview of the turn the message showed failed — checked on
  the turn whose digest the button carries, which the decision then binds under the row lock
  (``StaleTurn`` or ``AlreadyDecided`` if it changed meanwhile). Deny needs what it needs
  anywhere.
* **The reply** (``slack_link_reply``) is POSTed to the press's ``response_url``: a decision,
  and a refusal about the run itself (decided, changed, expired, gone), replace the run's
  buttons in the message for everyone with what happened and by whom; a refusal about the
  person (unlinked, not permitted, their own run under four-eyes, approving from chat not
  allowed) is shown to that person alone (``ephemeral``).

The reply goes only to Slack's host (``hooks.slack.com``) or a host of
``AGENTRUNS["WEBHOOK_ALLOWLIST"]``, through ``agentruns.outbound`` (no redirect, no private
address unless listed). Owns no state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from agentruns.authority import chat_approval_problem
from agentruns.chat.slack_blocks import APPROVE, DENY, outcome_blocks
from agentruns.chat.slack_requests import SlackAction
from agentruns.conf import app_settings
from agentruns.exceptions import (
    AlreadyDecided,
    ApprovalExpired,
    ChatApprovalRefused,
    ChatUserUnknown,
    LeaseholdError,
    NotPermitted,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    UnreadableState,
)
from agentruns.models import AgentRun, SlackUser, Status
from agentruns.notification_text import plain, slack_escaped, when_text
from agentruns.outbound import post_json
from agentruns.services.decisions import run_decide
from agentruns.tools.shown import shown_turn
from agentruns.turns import read_pending_turn
from agentruns.versions import pinned_configuration

logger = logging.getLogger(__name__)

#: Where Slack's ``response_url`` points (beside the webhook allowlist).
SLACK_HOSTS = ("hooks.slack.com",)
#: Refusals about the run, not the person: its buttons are stale for everyone.
RUN_REFUSALS = (
    AlreadyDecided,
    ApprovalExpired,
    NotWaiting,
    RunNotFound,
    StaleTurn,
    UnreadableState,
)
# Decisions from chat are recorded and handed to a worker (as the inbox's).
DECISION_MODE = "queued"


@dataclass(frozen=True)
class ChatReply:
    """What became of a press: the sentence, and whether it updates the message for everyone
    (``replace``) or is shown to the presser alone."""

    text: str
    replace: bool
    decided: bool = False


def chat_account(slack_user_id: str) -> Any:
    """The Django account linked to ``slack_user_id``; ``ChatUserUnknown`` when none is, and
    ``NotPermitted`` when it is inactive or not staff."""
    link = SlackUser.objects.filter(slack_user_id=slack_user_id).select_related("user").first()
    if link is None or not slack_user_id:
        raise ChatUserUnknown()
    user = get_user_model()._default_manager.filter(pk=link.user_id).first()
    if user is None or not user.is_active or not getattr(user, "is_staff", False):
        raise NotPermitted(f"the account {user.get_username() if user else '?'} may not decide")
    return user


def _approvable(run_uuid: str, turn_digest: str) -> None:
    """Refuse (``ChatApprovalRefused``) approving from chat what ``chat_approval_problem``
    refuses on the turn the button showed. A run that no longer waits on that turn is left to
    ``run_decide``, which says why (already decided, changed, not waiting, no such run)."""
    run = (
        AgentRun.objects.filter(uuid=run_uuid)
        .select_related("configuration")
        .only("uuid", "status", "pending_turn", "request", "configuration", "config_version")
        .first()
    )
    if run is None or run.status != Status.WAITING_FOR_APPROVAL:
        return
    pending = shown_turn(run, read_pending_turn(run))
    if pending.turn_digest != turn_digest:
        return
    problem = chat_approval_problem(configuration=pinned_configuration(run), pending=pending)
    if problem is not None:
        raise ChatApprovalRefused(f"Approving from Slack is refused: {problem}.")


def chat_decide(*, slack_user_id: str, run_uuid: str, turn_digest: str, approved: bool) -> str:
    """Decide the turn ``turn_digest`` of ``run_uuid`` as ``slack_user_id``'s account; the
    account's name. Raises every refusal of ``run_decide``, and ``ChatUserUnknown``,
    ``NotPermitted``, ``ChatApprovalRefused``, ``StaleTurn`` before it."""
    user = chat_account(slack_user_id)
    if approved:
        _approvable(run_uuid, turn_digest)
    run_decide(
        run_uuid=run_uuid,
        actor=user,
        approved=approved,
        turn_digest=turn_digest,
        mode=DECISION_MODE,
    )
    return str(user.get_username())


def slack_action_handle(*, action: SlackAction) -> ChatReply | None:
    """Carry out a verified button press and reply to it (``response_url``); ``None`` for a
    press that decides nothing (*Open* is a link: Slack still reports it)."""
    decision = action.decision
    if action.action_id not in (APPROVE, DENY) or decision is None:
        return None
    run_uuid, digest = decision
    approved = action.action_id == APPROVE
    try:
        name = chat_decide(
            slack_user_id=action.slack_user_id,
            run_uuid=run_uuid,
            turn_digest=digest,
            approved=approved,
        )
    except LeaseholdError as exc:
        reply = ChatReply(
            text=slack_escaped(f"Not decided: {plain(exc.message, 300)}"),
            replace=isinstance(exc, RUN_REFUSALS),
        )
    else:
        verdict = "Approved" if approved else "Denied"
        said = slack_escaped(f"{verdict} by {plain(name, 40)} at {when_text(timezone.now())}")
        reply = ChatReply(text=f"{said} (<@{action.slack_user_id}>)", replace=True, decided=True)
    slack_reply_post(action, run_uuid=run_uuid, reply=reply)
    return reply


def slack_reply_post(action: SlackAction, *, run_uuid: str, reply: ChatReply) -> bool:
    """POST ``reply`` to the press's ``response_url``; whether Slack took it. A failure is
    logged: the decision (if any) stands, and the message keeps its buttons, which now refuse."""
    if reply.replace:
        body: dict[str, Any] = {
            "replace_original": True,
            "text": reply.text,
            "blocks": outcome_blocks(action.message_blocks, run_uuid=run_uuid, text=reply.text),
        }
    else:
        body = {"replace_original": False, "response_type": "ephemeral", "text": reply.text}
    if not action.response_url:
        return False
    try:
        answer = post_json(
            action.response_url,
            body,
            allowlist=[*SLACK_HOSTS, *app_settings().webhook_allowlist],
            timeout=app_settings().notify_webhook_timeout_seconds,
        )
    except Exception as exc:  # refused, unreachable, timed out
        logger.warning("the reply to Slack failed: %s: %s", type(exc).__name__, exc)
        return False
    if not 200 <= answer.status < 300:
        logger.warning("the reply to Slack was answered %s: %s", answer.status, answer.body[:200])
        return False
    return True
