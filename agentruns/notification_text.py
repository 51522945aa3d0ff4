"""What a notification says (README "Notifications"): the waiting runs as items, who may decide
each, and the plain text of an email digest or a Slack-compatible webhook message.

Recipients are decided by ``agentruns.authority``, the rule the decision services and the inbox
apply: a person is told about a run only when they could open its card and decide it. Text a
model or an operator chose (tool names, configuration names, user names) is flattened to one line
of printable characters and bounded before it is put in a message, and escaped for Slack's
markup in a webhook's text; the subject holds no such text at all, so nothing can add a header.

Reads only: ``waiting_items`` is one query; ``may_be_told`` queries a person's permissions and
groups once per ``Decider``.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.urls import NoReverseMatch, reverse

from agentruns.authority import (
    DECIDE_PERMISSION,
    Decider,
    approval_authority,
    deciding_authority,
    escalation_of,
)
from agentruns.conf import app_settings
from agentruns.models import AgentRun, Status
from agentruns.review_links import review_token
from agentruns.tools.shown import shown_turn
from agentruns.turns import APPROVAL, INPUT, RECONCILIATION, PendingTurn, read_pending_turn
from agentruns.turns.checks import LEFT_TO_PERSON

# Bounds on what one message lists and on each piece of chosen text in it.
ITEMS_LISTED = 50
TEXT_CHARS = 80

WAITING_FOR_A_PERSON = (
    Status.WAITING_FOR_APPROVAL,
    Status.WAITING_FOR_INPUT,
    Status.WAITING_FOR_RECONCILIATION,
)
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


@dataclass(frozen=True)
class Item:
    """One wait of one run: ``key`` names this wait (run, status, turn digest), so a run that
    waits again later is a new item."""

    key: str
    run: AgentRun
    pending: PendingTurn
    since: datetime

    @property
    def what(self) -> str:
        """What waits, in words, e.g. ``approval of create_note (non-idempotent write)``."""
        calls = self.pending.calls
        if self.pending.kind == APPROVAL:
            named = [c for c in calls if c.needs_approval] or list(calls)
            listed = ", ".join(
                f"{plain(c.name)} ({plain(c.effect_label)})" if c.effect else plain(c.name)
                for c in named[:5]
            )
            more = f" and {len(named) - 5} more" if len(named) > 5 else ""
            return f"approval of {listed}{more}"
        if self.pending.kind == INPUT and self.pending.call is not None:
            return f"input for {plain(self.pending.call.name)}"
        if self.pending.kind == RECONCILIATION and self.pending.call is not None:
            return f"reconciliation: did {plain(self.pending.call.name)} land?"
        return "a decision (its pending turn cannot be read; open the card)"

    @property
    def label(self) -> str:
        """The configuration's label, flattened."""
        return plain(str(self.run.configuration))


def plain(text: object, limit: int = TEXT_CHARS) -> str:
    """``text`` as one line of printable characters: control, format and separator characters
    (newlines included) become spaces, runs of spaces one space; longer than ``limit``: cut,
    ending in ``…``."""
    flat = "".join(" " if unicodedata.category(ch)[0] in ("C", "Z") else ch for ch in str(text))
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def slack_escaped(text: str) -> str:
    """``text`` safe in Slack's ``text`` markup: ``&``, ``<`` and ``>`` as entities, so no
    chosen text can form a link or a mention (``<!channel>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def waiting_items() -> list[Item]:
    """Every run waiting for a person, oldest wait first (one query, the configuration and its
    approver group joined). A write in doubt whose tool's automatic check is still scheduled,
    running or retrying waits for the check, not yet for a person: it is left out until the
    check leaves it to a person."""
    runs = (
        AgentRun.objects.filter(status__in=WAITING_FOR_A_PERSON)
        .select_related("configuration__approver_group", "config_version", "escalated_to")
        .order_by("updated_at", "pk")
    )
    return [item for item in map(item_for, runs) if item is not None]


def item_for(run: AgentRun) -> Item | None:
    """``run``'s wait as an item (its turn as its card shows it), or ``None`` when there is
    nobody to tell yet (its tool's own check still asks whether an in-doubt write landed). An
    escalated wait is a new item: its group, and everyone else who may decide, hear of it."""
    pending = shown_turn(run, read_pending_turn(run))  # as its card shows it
    if pending.check is not None and pending.check.state != LEFT_TO_PERSON:
        return None
    key = f"{run.pk}:{run.status}:{pending.turn_digest}"
    if escalation_of(run) is not None:
        key += f":escalated:{run.escalated_to_id}"
    return Item(key=key, run=run, pending=pending, since=run.updated_at)


def candidates() -> QuerySet[AbstractBaseUser]:
    """Active staff users with an email address who hold ``decide_agentrun`` through the model
    backend (directly, through a group, or as superusers): the people worth asking
    ``may_be_told``. Empty when the project does not use the model backend (fail closed)."""
    from django.conf import settings

    user_model = get_user_model()
    if MODEL_BACKEND not in settings.AUTHENTICATION_BACKENDS:
        return user_model.objects.none()
    users = user_model.objects.with_perm(
        DECIDE_PERMISSION, is_active=True, include_superusers=True, backend=MODEL_BACKEND
    )
    fields = {field.name for field in user_model._meta.get_fields()}
    email = user_model.get_email_field_name()
    if "is_staff" not in fields or email not in fields:
        return user_model.objects.none()
    return users.filter(is_staff=True).exclude(**{email: ""}).exclude(**{f"{email}__isnull": True})


def may_be_told(decider: Decider, item: Item) -> bool:
    """Whether the person may open ``item``'s card and decide its wait: staff (the inbox is
    staff-only) and active, and for an approval or a reconciliation every authority approving
    or saying it landed needs (``approval_authority``: the tools' permissions, the configuration's
    approver group); for input (and a turn that cannot be read) ``decide_agentrun``."""
    user = decider.user
    if user is None or not decider.authenticated:
        return False
    if not (getattr(user, "is_active", False) and getattr(user, "is_staff", False)):
        return False
    if item.pending.kind in (APPROVAL, RECONCILIATION):
        authority = approval_authority(
            user=decider,
            configuration=item.run.configuration,
            pending=item.pending,
            escalated_to=escalation_of(item.run),
        )
    else:
        authority = deciding_authority(decider)
    return authority.allowed


def site_link(path: str) -> str:
    """``path`` made absolute with ``AGENTRUNS_SITE_URL`` (a path alone when it is empty)."""
    base = app_settings().site_url.rstrip("/")
    return f"{base}{path}"


def card_link(run: AgentRun) -> str:
    """The absolute link to ``run``'s card: the approvals inbox's run page when the project
    mounts it, else the admin's page of the run."""
    for name, args in (
        ("approvals:run", [run.uuid]),
        ("admin:agentruns_agentrun_change", [run.pk]),
    ):
        try:
            return site_link(reverse(name, args=args))
        except NoReverseMatch:
            continue
    return site_link(f"/{quote(str(run.uuid))}")


def review_link(
    item: Item, *, user_id: int | None = None, configuration_id: int | None = None
) -> str:
    """The absolute signed link to review ``item`` (``agentruns.review_links``), for one person
    (``user_id``) or one configuration's channel (``configuration_id``): it opens the run's
    card with its verdict buttons, and decides nothing. The card's link when the project does
    not mount the approvals inbox."""
    token = review_token(
        run=item.run,
        turn_digest=item.pending.turn_digest,
        user_id=user_id,
        configuration_id=configuration_id,
    )
    try:
        return site_link(reverse("approvals:review", args=[item.run.uuid, token]))
    except NoReverseMatch:
        return card_link(item.run)


def inbox_link() -> str:
    try:
        return site_link(reverse("approvals:inbox"))
    except NoReverseMatch:
        return site_link("/")


def when_text(moment: datetime) -> str:
    """``moment`` in UTC, to the minute (a naive value, from USE_TZ=False, as it is)."""
    if moment.tzinfo is None:
        return moment.strftime("%Y-%m-%d %H:%M")
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _escalated(item: Item) -> str:
    group = escalation_of(item.run)
    if group is None or item.run.escalated_at is None:
        return ""
    return f"; escalated to {plain(group.name, 40)} at {when_text(item.run.escalated_at)}"


@dataclass(frozen=True)
class Message:
    subject: str
    body: str


def email_digest(
    *, name: str, new: list[Item], still_waiting: int, recipient_id: int | None = None
) -> Message:
    """The email to one person: the waits they were not told about yet, each with its card's
    link (and, for ``recipient_id``, the signed link to review and decide it), and how many
    they were told about before still wait. Plain text; the subject holds only a count."""
    count = len(new)
    subject = (
        f"Leasehold: {count} run{'s' if count != 1 else ''} wait{'' if count != 1 else 's'} for you"
    )
    lines = [f"Hello {plain(name, 40)},", "", "These runs wait for a decision you may make:", ""]
    for number, item in enumerate(new[:ITEMS_LISTED], start=1):
        lines += [
            f"{number}. {item.label}: {item.what}",
            f"   waiting since {when_text(item.since)}{_escalated(item)}",
            f"   {card_link(item.run)}",
        ]
        if recipient_id is not None:
            lines.append(f"   review and decide: {review_link(item, user_id=recipient_id)}")
        lines.append("")
    if count > ITEMS_LISTED:
        lines += [f"... and {count - ITEMS_LISTED} more.", ""]
    if still_waiting:
        lines += [
            f"{still_waiting} run{'s' if still_waiting != 1 else ''} you were told about before "
            f"still wait{'s' if still_waiting == 1 else ''}.",
            "",
        ]
    minutes = max(1, round(app_settings().notify_interval / 60))
    lines += [
        f"The inbox: {inbox_link()}",
        "",
        f"Leasehold sends you at most one message every {minutes} minute"
        f"{'s' if minutes != 1 else ''}.",
    ]
    return Message(subject=subject, body="\n".join(lines) + "\n")


def escalation_email(*, name: str, item: Item, recipient_id: int) -> Message:
    """The email telling one member of the escalation group, at once, that ``item`` was
    escalated to them: what waits, until when, and the signed link to review and decide it.
    The subject holds no chosen text."""
    group = escalation_of(item.run)
    deadline = item.run.approval_deadline
    lines = [
        f"Hello {plain(name, 40)},",
        "",
        "Nobody decided this run before its deadline, so it was escalated to "
        f"{plain(group.name if group else '?', 40)}, a group you are in:",
        "",
        f"{item.label}: {item.what}",
        f"waiting since {when_text(item.since)}",
    ]
    if deadline is not None:
        lines.append(f"decide before {when_text(deadline)}")
    lines += [
        "",
        f"Review and decide: {review_link(item, user_id=recipient_id)}",
        f"The run: {card_link(item.run)}",
        "",
    ]
    return Message(subject="Leasehold: a run was escalated to you", body="\n".join(lines) + "\n")


def webhook_text(*, label: str, new: list[Item]) -> str:
    """A configuration's webhook message (Slack's ``text``): its new waits, one line each with
    the card's link; chosen text escaped for Slack's markup."""
    count = len(new)
    head = (
        f"Leasehold: {count} run{'s' if count != 1 else ''} of {plain(label)} "
        f"wait{'' if count != 1 else 's'} for a person"
    )
    lines = [slack_escaped(head)]
    for item in new[:ITEMS_LISTED]:
        lines.append(
            slack_escaped(f"• {item.what}, since {when_text(item.since)}: {card_link(item.run)}")
        )
    if count > ITEMS_LISTED:
        lines.append(f"… and {count - ITEMS_LISTED} more")
    return "\n".join(lines)
