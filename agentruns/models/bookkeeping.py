"""Tables kept beside the runs, each written by one module through guarded statements:
``Counter`` (running totals for ``/metrics``), ``NotificationState`` (who was told what,
``services.notifications``), ``SpendDay`` (the daily spend ledger) and ``SpendHold`` (the
reservations of the model calls in flight; both ``agentruns.budgets``).
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from agentruns.models.configuration import AgentConfiguration


class Counter(models.Model):
    """A running total for ``/metrics`` that no cheap query can give (the reaper's verdicts by
    rule): one row per name and label set, raised by ``UPDATE … SET value = value + n``."""

    name = models.CharField(max_length=64)
    # The label set, canonical: ``key=value`` pairs sorted by key, comma-separated.
    labels = models.CharField(max_length=255, blank=True)
    value = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "labels"], name="counter_name_labels")
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}} {self.value}"


class NotificationChannel(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook"


class NotificationState(models.Model):
    """Who was told what (``agentruns.services.notifications``): one row per person (email) or
    per configuration (its webhook).

    ``last_sent_at`` (database clock) is claimed by one guarded ``UPDATE`` before a digest is
    sent, so at most one digest per ``NOTIFY_INTERVAL`` leaves for a recipient whatever the
    number of concurrent passes; ``told`` holds the keys (run id, status, turn digest) of the
    waits already announced that were still waiting at the last digest.
    """

    channel = models.CharField(max_length=16, choices=NotificationChannel.choices)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
    )
    configuration = models.OneToOneField(
        AgentConfiguration, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # The token of the last claim: only that claim's pass records what it told.
    claim = models.CharField(max_length=32, blank=True)
    told = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(channel="email", user__isnull=False, configuration__isnull=True)
                    | models.Q(channel="webhook", user__isnull=True, configuration__isnull=False)
                ),
                name="notificationstate_one_recipient",
            )
        ]

    def __str__(self) -> str:
        who = f"user {self.user_id}" if self.user_id else f"configuration {self.configuration_id}"
        return f"{self.channel} to {who}"


class SpendScope(models.TextChoices):
    CONFIGURATION = "configuration", "configuration"
    USER = "user", "user"


class SpendDay(models.Model):
    """What was spent on model calls in one UTC day (the database's clock), per configuration
    (``key`` = its id) and per initiator (``key`` = the user's id): the ledger the daily budgets
    are checked against and ``/metrics`` sums (``agentruns.budgets``; docs/design.md §14).

    Written only by ``agentruns.budgets``, by guarded statements that add to the stored values:
    ``reserved`` rises when a call is admitted (the check's ``WHERE amount + reserved < limit``)
    and falls when its hold (``SpendHold``) is settled, released or lapses, in the transaction
    that deletes the hold; ``amount`` rises with a charge, in the same transaction as the events
    that record the answer. ``key`` is a plain id, not a foreign key, so a deleted user or
    configuration keeps its history.
    """

    day = models.DateField()
    scope = models.CharField(max_length=16, choices=SpendScope.choices)
    key = models.BigIntegerField()
    # Charged: the answers' costs, plus the holds that lapsed unsettled (at what they held).
    amount = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    calls = models.PositiveIntegerField(default=0)
    # The largest single call charged today: what a call of a configuration without
    # ``max_tokens_per_call`` holds back while in flight (budgets.reserve).
    largest = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    # Calls whose provider reported no token usage (charged 0).
    unknown_usage_calls = models.PositiveIntegerField(default=0)
    # The sum of the live holds on this row (``SpendHold.amount``): calls admitted, not settled.
    reserved = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))
    # Holds that lapsed before their segment settled them (charged at what they held).
    lapsed_holds = models.PositiveIntegerField(default=0)
    # Calls that cost more than their hold: the bound did not hold (or was only an estimate).
    overruns = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["day", "scope", "key"], name="spendday_day_scope_key")
        ]
        indexes = [models.Index(fields=["scope", "key", "day"], name="spendday_scope_key_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.scope}={self.key}: {self.amount}"


class SpendHold(models.Model):
    """A reservation in flight: what one model call holds back on one budget row (``SpendDay``
    of ``day``, ``scope``, ``key``) from its check until its answer is charged, its failure
    released, or it lapses (``agentruns.budgets``; docs/design.md §14). A call's rows share its
    ``token``.

    Inserted by the check in the transaction that raises the row's ``reserved``; deleted (the
    ``DELETE … RETURNING`` is the guard: exactly one of the settle, the release and the lapse
    finds it) in the transaction that lowers it again. A hold past ``expires_at`` lapses (the
    reaper): it is charged as spent at ``amount``, since its call may have been made by a
    segment that died before recording it; should that segment answer after all, its charge
    corrects the row by the difference. ``run_id`` is a plain id (the run may be purged).
    """

    token = models.CharField(max_length=32)
    day = models.DateField()
    scope = models.CharField(max_length=16, choices=SpendScope.choices)
    key = models.BigIntegerField()
    amount = models.DecimalField(max_digits=20, decimal_places=6)
    run_id = models.BigIntegerField()
    # The segment that made the call (its lease's ``claimed_by``).
    segment = models.CharField(max_length=255)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "scope", "key"], name="spendhold_token_row")
        ]
        indexes = [models.Index(fields=["expires_at"], name="spendhold_expires")]

    def __str__(self) -> str:
        return f"{self.day} {self.scope}={self.key}: {self.amount} held by run {self.run_id}"
