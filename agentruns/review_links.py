"""Signed review links (README "Deciding from email and Slack"): the link a notification carries
for each waiting run, which opens a confirmation page showing the run's whole card with its
verdict buttons. A link never decides: the page's buttons post the decision, CSRF-protected, to
the decision service, which checks everything as it does for the inbox.

A token is made with ``django.core.signing`` (the project's ``SECRET_KEY``), under a salt per
purpose — ``PERSON_SALT`` for a link sent to one person (an email digest), ``CHANNEL_SALT`` for
one posted to a configuration's webhook (a Slack channel: whoever opens it must still sign in and
hold the authority) — so a token made for one purpose, or anything else signed with the key, is
no token for another. It binds:

* the run (the page's URL names it too: a token for another run is refused),
* the turn digest of the wait it announced (a changed turn is said so, never shown as this one),
* its recipient (a person's id, or the configuration whose channel got it),
* its expiry: the wait's approval deadline when it has one, else ``LIFETIME`` after it was made.

``review_open`` reads a token for the signed-in person and says what the page shows. Reads only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.core import signing
from django.utils import timezone

from agentruns import selectors
from agentruns.authority import User
from agentruns.exceptions import (
    ReviewLinkExpired,
    ReviewLinkForAnotherAccount,
    ReviewLinkInvalid,
)
from agentruns.models import DEADLINE_STATUSES, AgentRun
from agentruns.tools.shown import shown_turn
from agentruns.turns import PendingTurn, read_pending_turn, waits_for_a_human

PERSON_SALT = "agentruns.review-link.person"
CHANNEL_SALT = "agentruns.review-link.channel"
#: How long a link lasts when the wait has no deadline.
LIFETIME = timedelta(hours=24)

# What the page shows (``Review.state``).
WAITING = "waiting"  # the turn the link announced still waits: its card, with the buttons
CHANGED = "changed"  # the run waits, but for another turn than the link announced
DECIDED = "decided"  # the run no longer waits for a person


@dataclass(frozen=True)
class ReviewLink:
    """A token, read and checked."""

    run_uuid: str
    turn_digest: str
    expires_at: datetime
    user_id: int | None = None  # a person's link
    configuration_id: int | None = None  # a channel's link


@dataclass(frozen=True)
class Review:
    """What a link opens: its run (``selectors.run_get``) and ``state``; ``pending`` is the
    turn as a card shows it when the run waits (its digest is the one a decision sends)."""

    link: ReviewLink
    run: AgentRun
    state: str
    pending: PendingTurn | None


def expiry_for(run: AgentRun) -> datetime:
    """When a link to ``run``'s current wait expires: its approval deadline, or ``LIFETIME``
    from now when it has none."""
    if run.status in DEADLINE_STATUSES and run.approval_deadline is not None:
        return run.approval_deadline
    return timezone.now() + LIFETIME


def review_token(
    *,
    run: AgentRun,
    turn_digest: str,
    user_id: int | None = None,
    configuration_id: int | None = None,
    expires_at: datetime | None = None,
) -> str:
    """A token for ``run``'s wait on ``turn_digest``, for one person (``user_id``) or one
    configuration's channel (``configuration_id``), expiring at ``expires_at`` (default
    ``expiry_for``)."""
    if (user_id is None) == (configuration_id is None):
        raise ValueError("a review link is for one person or one channel")
    expires = expires_at if expires_at is not None else expiry_for(run)
    payload: dict[str, Any] = {
        "r": str(run.uuid),
        "d": turn_digest,
        "e": int(expires.timestamp()),
    }
    if user_id is not None:
        payload["u"] = user_id
        return signing.dumps(payload, salt=PERSON_SALT, compress=True)
    payload["c"] = configuration_id
    return signing.dumps(payload, salt=CHANNEL_SALT, compress=True)


def _load(token: str) -> tuple[dict[str, Any], str]:
    """The token's payload and the salt it was signed under; ``ReviewLinkInvalid`` otherwise."""
    for salt in (PERSON_SALT, CHANNEL_SALT):
        try:
            payload = signing.loads(token, salt=salt)
        except signing.BadSignature:
            continue
        if isinstance(payload, dict):
            return payload, salt
    raise ReviewLinkInvalid()


def review_link_read(*, token: str, run_uuid: UUID | str, user: User | None) -> ReviewLink:
    """``token`` checked for ``user`` opening it at ``run_uuid``'s page.

    Refusals: ``ReviewLinkInvalid`` (not signed by this site for a review, malformed, or for
    another run), ``ReviewLinkForAnotherAccount`` (a person's link opened by anyone else),
    ``ReviewLinkExpired`` (its ``expired_at`` says when), in that order."""
    payload, salt = _load(token)
    run, digest, expires = payload.get("r"), payload.get("d"), payload.get("e")
    if not (isinstance(run, str) and isinstance(digest, str) and type(expires) is int):
        raise ReviewLinkInvalid()
    if run != str(run_uuid):
        raise ReviewLinkInvalid("This review link was made for another run.")
    link = ReviewLink(
        run_uuid=run,
        turn_digest=digest,
        expires_at=datetime.fromtimestamp(expires, tz=UTC),
        user_id=payload.get("u") if salt == PERSON_SALT else None,
        configuration_id=payload.get("c") if salt == CHANNEL_SALT else None,
    )
    if salt == PERSON_SALT and (
        user is None or not user.is_authenticated or user.pk != link.user_id
    ):
        raise ReviewLinkForAnotherAccount()
    if timezone.now() >= link.expires_at:
        raise ReviewLinkExpired(
            f"This review link expired at {link.expires_at:%Y-%m-%d %H:%M} UTC: open the run "
            "from the inbox.",
            expired_at=link.expires_at.isoformat(),
        )
    return link


def review_open(*, token: str, run_uuid: UUID | str, user: User | None) -> Review:
    """What ``user`` sees opening ``token`` for ``run_uuid``: the link checked
    (``review_link_read``), the run as they may see it (``RunNotFound`` otherwise) and whether
    the announced turn still waits (``WAITING``), was replaced by another (``CHANGED``) or the
    run waits for nobody now (``DECIDED``)."""
    link = review_link_read(token=token, run_uuid=run_uuid, user=user)
    run = selectors.run_get(run_uuid=run_uuid, user=user)
    if link.configuration_id is not None and link.configuration_id != run.configuration_id:
        raise ReviewLinkInvalid("This review link was made for another run.")
    if not waits_for_a_human(run):
        return Review(link=link, run=run, state=DECIDED, pending=None)
    pending = shown_turn(run, read_pending_turn(run))
    state = WAITING if pending.turn_digest == link.turn_digest else CHANGED
    return Review(link=link, run=run, state=state, pending=pending)
