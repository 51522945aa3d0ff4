"""Linking Slack users to Django accounts (``SlackUser``): what ``manage.py slack_users`` does;
the admin edits the same rows. A link says whose authority a Slack user's button presses carry
(``services.chat_decisions``); it grants nothing by itself.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet

from agentruns.exceptions import InvalidRequest
from agentruns.models import SlackUser


def slack_user_link(*, username: str, slack_user_id: str) -> tuple[SlackUser, bool]:
    """Link ``slack_user_id`` to the account ``username`` (moving it from another account if it
    was linked elsewhere); the row and whether it changed. ``InvalidRequest`` for an unknown
    username or a malformed Slack user id."""
    user_model = get_user_model()
    user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
    if user is None:
        raise InvalidRequest(f"no user {username!r}", field="username")
    row = SlackUser(slack_user_id=slack_user_id, user=user)
    try:
        row.full_clean(validate_unique=False)
    except ValidationError as exc:
        raise InvalidRequest(
            "; ".join(exc.message_dict.get("slack_user_id", ["invalid"])), field="slack_user_id"
        ) from None
    with transaction.atomic():
        existing = SlackUser.objects.select_for_update().filter(slack_user_id=slack_user_id).first()
        if existing is not None and existing.user_id == user.pk:
            return existing, False
        if existing is not None:
            existing.user = user
            existing.save(update_fields=["user"])
            return existing, True
        row.save()
    return row, True


def slack_user_unlink(*, slack_user_id: str) -> bool:
    """Remove ``slack_user_id``'s link; whether there was one."""
    deleted, _ = SlackUser.objects.filter(slack_user_id=slack_user_id).delete()
    return deleted > 0


def slack_users_list() -> QuerySet[SlackUser]:
    return SlackUser.objects.select_related("user").order_by("slack_user_id")
