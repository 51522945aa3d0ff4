"""``manage.py slack_users``: which Django account each Slack user's button presses act as.

* ``slack_users link USERNAME SLACK_USER_ID`` — link (or move) a Slack user id to an account;
* ``slack_users unlink SLACK_USER_ID`` — remove a link;
* ``slack_users list`` — every link.

Exit status 2 for an unknown user, a malformed id or an unknown link (``CommandError``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns.exceptions import InvalidRequest
from agentruns.services.slack_links import slack_user_link, slack_user_unlink, slack_users_list


class Command(BaseCommand):
    help = "Link Slack users to Django accounts for deciding from Slack: link, unlink, list."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        link = sub.add_parser("link", help="Link a Slack user id to a Django account.")
        link.add_argument("username")
        link.add_argument("slack_user_id")
        unlink = sub.add_parser("unlink", help="Remove a Slack user id's link.")
        unlink.add_argument("slack_user_id")
        sub.add_parser("list", help="List every link.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "link":
            try:
                row, changed = slack_user_link(
                    username=options["username"], slack_user_id=options["slack_user_id"]
                )
            except InvalidRequest as exc:
                raise CommandError(exc.message, returncode=2) from None
            said = "linked" if changed else "already linked"
            self.stdout.write(f"{said}: {row.slack_user_id} -> {row.user.get_username()}")
        elif action == "unlink":
            if not slack_user_unlink(slack_user_id=options["slack_user_id"]):
                raise CommandError(f"no link for {options['slack_user_id']}", returncode=2)
            self.stdout.write(f"unlinked {options['slack_user_id']}")
        else:
            for row in slack_users_list():
                self.stdout.write(f"{row.slack_user_id}\t{row.user.get_username()}")
