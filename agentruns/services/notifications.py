"""Telling people that runs wait for them (README "Notifications", docs/design.md §16).

``notifications_send`` is one pass, run by the django-q2 schedule ``agentruns: notify waiting
runs`` every minute (``setup_schedules``). It reads the waiting runs once; for each person who
may decide some of them (``agentruns.notification_text``) and each configuration with a
``notify_webhook_url``, it sends one digest of the waits that recipient was not told about yet —
at most one per ``NOTIFY_INTERVAL`` seconds per recipient:

1. **claim** (one guarded ``UPDATE`` of the recipient's ``NotificationState``): ``last_sent_at``
   becomes the database clock's now and ``claim`` a fresh token, only if ``last_sent_at`` is
   older than the interval. 0 rows: another pass sent (or is sending) this interval's digest, and
   this pass sends nothing to that recipient. Concurrent passes and duplicate task deliveries
   therefore send at most one digest per recipient per interval;
2. **send**, outside any transaction;
3. **record** (one ``UPDATE`` guarded by the claim token): ``told`` becomes the keys of every
   wait the digest covered and of those told before that still wait.

Dying between 1 and 2 sends nothing this interval; between 2 and 3, the next interval's digest
repeats these waits (told twice rather than never). A failed send (an SMTP error, a webhook
refused, non-2xx or timed out) is logged as a warning, counted in
``leasehold_notification_failures_total{channel}`` and retried after the interval. Nothing here
reads or writes a run beyond one ``SELECT`` of the waiting ones: a notification never touches
a run.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.mail import EmailMessage
from django.db import IntegrityError
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from agentruns.authority import Decider
from agentruns.chat.slack_blocks import webhook_blocks
from agentruns.conf import app_settings
from agentruns.metrics import NOTIFICATION_FAILURES, NOTIFICATIONS_SENT, counters_add
from agentruns.models import (
    DEADLINE_STATUSES,
    AgentConfiguration,
    AgentRun,
    NotificationChannel,
    NotificationState,
)
from agentruns.notification_text import (
    Item,
    candidates,
    email_digest,
    escalation_email,
    item_for,
    may_be_told,
    waiting_items,
    webhook_text,
)
from agentruns.outbound import post_json

logger = logging.getLogger(__name__)


@dataclass
class NotifyReport:
    """What one pass did, per channel."""

    waiting: int = 0
    sent: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    deferred: int = 0  # recipients with news whose interval has not passed (or another pass won)
    off: bool = False

    def summary(self) -> str:
        if self.off:
            return "notifications are off (AGENTRUNS_NOTIFY_INTERVAL is 0)"
        parts = [f"{self.waiting} run(s) waiting"]
        for channel in NotificationChannel.values:
            parts.append(
                f"{channel}: sent {self.sent.get(channel, 0)}, failed {self.failed.get(channel, 0)}"
            )
        parts.append(f"deferred {self.deferred}")
        return "; ".join(parts)


def notifications_send() -> NotifyReport:
    """One notification pass (see the module docstring). Never raises for a recipient's failure:
    it is logged and counted, and the next pass goes on."""
    interval = app_settings().notify_interval
    report = NotifyReport()
    if interval <= 0:
        report.off = True
        return report
    items = waiting_items()
    report.waiting = len(items)
    if items:
        if app_settings().notify_email:
            _email_everyone(items, interval, report)
        _post_webhooks(items, interval, report)
    _count(report)
    return report


# --- Email ---------------------------------------------------------------------------------------


def _email_everyone(items: list[Item], interval: int, report: NotifyReport) -> None:
    users = list(candidates())
    states = {
        state.user_id: state
        for state in NotificationState.objects.filter(
            channel=NotificationChannel.EMAIL, user_id__in=[u.pk for u in users]
        )
    }
    for user in users:
        decider = Decider(user)
        mine = [item for item in items if may_be_told(decider, item)]
        new = [item for item in mine if item.key not in _told(states.get(user.pk))]
        if not new:
            continue
        state = states.get(user.pk) or _state(channel=NotificationChannel.EMAIL, user=user)
        token = _claim(state, interval)
        if token is None:
            report.deferred += 1
            continue
        address = getattr(user, user.get_email_field_name(), "")
        message = email_digest(
            name=user.get_username(),
            new=new,
            still_waiting=len(mine) - len(new),
            recipient_id=user.pk,
        )
        try:
            EmailMessage(subject=message.subject, body=message.body, to=[address]).send()
        except Exception as exc:  # SMTP refused, unreachable, timed out: try after the interval
            logger.warning(
                "notification email to user %s failed: %s: %s", user.pk, type(exc).__name__, exc
            )
            report.failed[NotificationChannel.EMAIL] = (
                report.failed.get(NotificationChannel.EMAIL, 0) + 1
            )
            continue
        _record(state, token, [item.key for item in mine])
        report.sent[NotificationChannel.EMAIL] = report.sent.get(NotificationChannel.EMAIL, 0) + 1


# --- Webhooks ------------------------------------------------------------------------------------


def _post_webhooks(items: list[Item], interval: int, report: NotifyReport) -> None:
    by_configuration: dict[int, list[Item]] = {}
    for item in items:
        if item.run.configuration.notify_webhook_url:
            by_configuration.setdefault(item.run.configuration_id, []).append(item)
    if not by_configuration:
        return
    states = {
        state.configuration_id: state
        for state in NotificationState.objects.filter(
            channel=NotificationChannel.WEBHOOK, configuration_id__in=list(by_configuration)
        )
    }
    for configuration_id, waiting in by_configuration.items():
        configuration: AgentConfiguration = waiting[0].run.configuration
        new = [item for item in waiting if item.key not in _told(states.get(configuration_id))]
        if not new:
            continue
        state = states.get(configuration_id) or _state(
            channel=NotificationChannel.WEBHOOK, configuration=configuration
        )
        token = _claim(state, interval)
        if token is None:
            report.deferred += 1
            continue
        text = webhook_text(label=str(configuration), new=new)
        blocks = webhook_blocks(label=str(configuration), new=new)
        try:
            answer = post_json(
                configuration.notify_webhook_url,
                {"text": text, "blocks": blocks},
                allowlist=list(app_settings().webhook_allowlist),
                timeout=app_settings().notify_webhook_timeout_seconds,
            )
            if not 200 <= answer.status < 300:
                raise ConnectionError(f"the webhook answered {answer.status}: {answer.body[:200]}")
        except Exception as exc:  # refused, unreachable, timed out, non-2xx
            logger.warning(
                "notification webhook of configuration %s failed: %s: %s",
                configuration.slug,
                type(exc).__name__,
                exc,
            )
            report.failed[NotificationChannel.WEBHOOK] = (
                report.failed.get(NotificationChannel.WEBHOOK, 0) + 1
            )
            continue
        _record(state, token, [item.key for item in waiting])
        report.sent[NotificationChannel.WEBHOOK] = (
            report.sent.get(NotificationChannel.WEBHOOK, 0) + 1
        )


# --- Escalations ---------------------------------------------------------------------------------


@dataclass
class EscalationReport:
    """What telling an escalation group did."""

    told: int = 0
    failed: int = 0
    already: int = 0  # members told of this wait before (a duplicate task)

    def summary(self) -> str:
        return f"escalation: told {self.told}, failed {self.failed}, told before {self.already}"


def notify_escalated(*, run_uuid: str) -> EscalationReport:
    """Tell each member of the group ``run_uuid``'s wait was escalated to, at once (no interval,
    no claim: an escalation is rare and urgent), by email with their signed review link: the
    members ``candidates`` holds who ``may_be_told`` about it. Each one told is remembered in
    their ``told`` (guarded by their row's ``claim``: if a digest claimed it meanwhile, that
    digest's record wins and they may hear of it twice, never not at all); one told before is
    skipped, so a duplicate task tells nobody twice. Nothing when the run no longer waits
    escalated or email is off."""
    report = EscalationReport()
    run = (
        AgentRun.objects.filter(uuid=run_uuid, status__in=list(DEADLINE_STATUSES))
        .select_related("configuration__approver_group", "config_version", "escalated_to")
        .first()
    )
    if run is None or run.escalated_to_id is None or not app_settings().notify_email:
        return report
    item = item_for(run)
    if item is None:
        return report
    members = candidates()
    if "groups" not in {field.name for field in members.model._meta.get_fields()}:
        return report  # a user model without groups: nobody is in the group (fail closed)
    for user in members.filter(**{"groups": run.escalated_to_id}):
        if not may_be_told(Decider(user), item):
            continue
        state = _state(channel=NotificationChannel.EMAIL, user=user)
        if item.key in _told(state):
            report.already += 1
            continue
        message = escalation_email(name=user.get_username(), item=item, recipient_id=user.pk)
        address = getattr(user, user.get_email_field_name(), "")
        try:
            EmailMessage(subject=message.subject, body=message.body, to=[address]).send()
        except Exception as exc:  # the next digest tells them
            logger.warning(
                "escalation email to user %s failed: %s: %s", user.pk, type(exc).__name__, exc
            )
            report.failed += 1
            continue
        NotificationState.objects.filter(pk=state.pk, claim=state.claim).update(
            told=sorted(_told(state) | {item.key})
        )
        report.told += 1
    _count(
        NotifyReport(
            sent={NotificationChannel.EMAIL: report.told},
            failed={NotificationChannel.EMAIL: report.failed},
        )
    )
    return report


# --- The per-recipient state ---------------------------------------------------------------------


def _told(state: NotificationState | None) -> set[str]:
    """The keys of the waits already announced to the recipient (none without a row)."""
    told = state.told if state is not None else []
    return {key for key in told if isinstance(key, str)} if isinstance(told, list) else set()


def _state(**recipient: object) -> NotificationState:
    """The recipient's row, created (never sent, nothing told) on first use; a concurrent
    creation by another pass is read back."""
    try:
        state, _ = NotificationState.objects.get_or_create(**recipient)  # type: ignore[arg-type]
    except IntegrityError:  # lost the insert race on a unique recipient
        state = NotificationState.objects.get(**recipient)
    return state


def _claim(state: NotificationState, interval: int) -> str | None:
    """Claim this interval's digest for ``state``'s recipient: one ``UPDATE`` guarded by
    ``last_sent_at`` being older than ``interval`` seconds (database clock). Returns the claim's
    token, or ``None`` when 0 rows matched (sent less than an interval ago, by any pass)."""
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=interval)), output_field=DateTimeField()
    )
    token = uuid.uuid4().hex
    claimed = NotificationState.objects.filter(
        Q(last_sent_at__isnull=True) | Q(last_sent_at__lte=cutoff), pk=state.pk
    ).update(last_sent_at=Now(), claim=token)
    return token if claimed == 1 else None


def _record(state: NotificationState, token: str, keys: list[str]) -> None:
    """Remember what the digest sent under ``token`` covered: the waits it listed and those told
    before that still wait. Guarded by the token: a later claim's record wins."""
    NotificationState.objects.filter(pk=state.pk, claim=token).update(told=sorted(set(keys)))


def _count(report: NotifyReport) -> None:
    increments = [
        (NOTIFICATIONS_SENT, {"channel": channel}, n) for channel, n in report.sent.items() if n
    ] + [
        (NOTIFICATION_FAILURES, {"channel": channel}, n)
        for channel, n in report.failed.items()
        if n
    ]
    try:
        counters_add(sorted(increments, key=lambda i: (i[0], sorted(i[1].items()))))
    except Exception:  # the digests went (or failed) anyway; only the count is lost
        logger.exception("could not count notifications for /metrics")
