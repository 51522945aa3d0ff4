"""``SlackUser``: which Django account a Slack user acts as when they press a button of a
notification (``agentruns.chat``). Kept in the admin and by ``manage.py slack_users``; a Slack
user with no row here decides nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

#: A Slack user id as Slack writes it (``U…`` or, on Enterprise Grid, ``W…``).
SLACK_USER_ID_RE = r"^[UW][A-Z0-9]{2,30}$"


class SlackUser(models.Model):
    """One Slack user id, mapped to the Django account whose authority its buttons carry."""

    slack_user_id = models.CharField(
        max_length=32,
        unique=True,
        validators=[RegexValidator(SLACK_USER_ID_RE, "A Slack user id: U or W, then letters.")],
        help_text="The Slack user id (Profile → ⋮ → Copy member ID), e.g. U024BE7LH.",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_users"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slack_user_id"]
        verbose_name = "Slack user"

    def __str__(self) -> str:
        return f"{self.slack_user_id} → {self.user}"
