"""The Block Kit of Leasehold's Slack messages: the notification webhook's message (a section and
buttons per waiting run) and the updates a button's reply makes to it.

Per run, the buttons are *Approve* (only when ``authority.chat_approval_problem`` finds nothing
against it: the configuration allows approving from chat and no preview of the turn failed),
*Deny* (an approval) and *Open* (the run's signed review link, for its configuration's channel;
left out when ``AGENTRUNS["SITE_URL"]`` is empty, as Slack refuses a relative URL). Approve and
Deny carry ``<run uuid>:<turn digest>``: the press decides the turn the message showed, or
nothing. Chosen text (tool, configuration and user names) is flattened, bounded and escaped for
Slack's markup (``notification_text``). Pure: reads no database beyond what the items hold.
"""

from __future__ import annotations

from typing import Any

from agentruns.authority import chat_approval_problem
from agentruns.notification_text import (
    Item,
    inbox_link,
    plain,
    review_link,
    slack_escaped,
    when_text,
)
from agentruns.turns import APPROVAL
from agentruns.versions import pinned_configuration

APPROVE = "leasehold_approve"
DENY = "leasehold_deny"
OPEN = "leasehold_open"
#: Runs a message shows with buttons (two blocks each; Slack allows 50 blocks).
BLOCK_ITEMS = 20
ACTIONS_PREFIX = "leasehold:actions:"

Block = dict[str, Any]


def _text(kind: str, text: str) -> dict[str, str]:
    return {"type": kind, "text": text}


def button_value(item: Item) -> str:
    """What Approve and Deny carry: the run and the digest of the turn shown."""
    return f"{item.run.uuid}:{item.pending.turn_digest}"


def _buttons(item: Item) -> list[Block]:
    buttons: list[Block] = []
    if item.pending.kind == APPROVAL:
        configuration = pinned_configuration(item.run)
        problem = chat_approval_problem(configuration=configuration, pending=item.pending)
        if problem is None:
            buttons.append(
                {
                    "type": "button",
                    "action_id": APPROVE,
                    "text": _text("plain_text", "Approve"),
                    "style": "primary",
                    "value": button_value(item),
                    "confirm": {
                        "title": _text("plain_text", "Approve this turn?"),
                        "text": _text("plain_text", plain(item.what, 300)),
                        "confirm": _text("plain_text", "Approve"),
                        "deny": _text("plain_text", "Cancel"),
                    },
                }
            )
        buttons.append(
            {
                "type": "button",
                "action_id": DENY,
                "text": _text("plain_text", "Deny"),
                "style": "danger",
                "value": button_value(item),
            }
        )
    link = review_link(item, configuration_id=item.run.configuration_id)
    if link.startswith(("https://", "http://")):
        buttons.append(
            {
                "type": "button",
                "action_id": OPEN,
                "text": _text("plain_text", "Open"),
                "url": link,
            }
        )
    return buttons


def webhook_blocks(*, label: str, new: list[Item]) -> list[Block]:
    """The blocks of a configuration's webhook message: a heading, then per run (at most
    ``BLOCK_ITEMS``) what waits and its buttons."""
    count = len(new)
    blocks: list[Block] = [
        {
            "type": "section",
            "text": _text(
                "mrkdwn",
                slack_escaped(
                    f"*Leasehold*: {count} run{'s' if count != 1 else ''} of {plain(label)} "
                    f"wait{'' if count != 1 else 's'} for a person"
                ),
            ),
        }
    ]
    for item in new[:BLOCK_ITEMS]:
        blocks.append(
            {
                "type": "section",
                "block_id": f"leasehold:run:{item.run.uuid}",
                "text": _text(
                    "mrkdwn",
                    slack_escaped(f"{item.what}\nrun {str(item.run.uuid)[:8]}, since ")
                    + slack_escaped(when_text(item.since)),
                ),
            }
        )
        buttons = _buttons(item)
        if buttons:
            blocks.append(
                {
                    "type": "actions",
                    "block_id": f"{ACTIONS_PREFIX}{item.run.uuid}",
                    "elements": buttons,
                }
            )
    if count > BLOCK_ITEMS:
        blocks.append(
            {
                "type": "context",
                "elements": [
                    _text(
                        "mrkdwn", slack_escaped(f"… and {count - BLOCK_ITEMS} more: {inbox_link()}")
                    )
                ],
            }
        )
    return blocks


def outcome_blocks(original: list[Any] | None, *, run_uuid: str, text: str) -> list[Block]:
    """``original`` (the message's blocks, as Slack sent them back) with the run's buttons
    replaced by ``text``: what became of it. Without the original (or with no block of that
    run), the text alone."""
    said: Block = {"type": "context", "elements": [_text("mrkdwn", text)]}
    if not isinstance(original, list):
        return [said]
    target = f"{ACTIONS_PREFIX}{run_uuid}"
    blocks = [
        said if isinstance(block, dict) and block.get("block_id") == target else block
        for block in original
    ]
    return blocks if said in blocks else [*original, said]
