"""``AgentConfiguration``: what an agent is (provider, model, prompt, tools, limits, approvers,
deadline, prices, budget and a call's token bound), edited in the admin and validated by its
``clean``.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from agentruns.models.choices import FINAL_TIMEOUT_ACTIONS, ApprovalTimeoutAction, Provider
from agentruns.secrets import secret_env_problem
from agentruns.storable import json_problem

if TYPE_CHECKING:
    from agentruns.versions import PinnedValues

#: The longest provider call a configuration may allow (``timeout_seconds``).
MAX_TIMEOUT_SECONDS = 3600
#: The most tokens a configuration may let one answer hold (``max_output_tokens``).
MAX_OUTPUT_TOKENS = 1_000_000
#: The largest round cap a configuration may hold (``max_iterations``, a 16-bit column).
MAX_ROUND_CAP = 32767
#: The furthest approval deadline a configuration may set (``approval_timeout``): beyond any
#: wait a person would mean, and far inside what the database's timestamps hold.
MAX_APPROVAL_TIMEOUT = timedelta(days=366)


class AgentConfiguration(models.Model):
    """What an agent is: its provider, model, prompt, tools and limits. Edited in the admin."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.SCRIPTED)
    model = models.CharField(max_length=200, blank=True)
    base_url = models.URLField(
        blank=True,
        help_text="The provider's endpoint: OpenAI-compatible, e.g. http://127.0.0.1:8080/v1; "
        "Anthropic, e.g. https://api.anthropic.com. Empty: the SDK's default.",
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        help_text=(
            "Name of the environment variable holding the API key (never the key itself), "
            "starting with an allowed prefix (AGENTRUNS['SECRET_ENV_PREFIXES'], by default "
            "LEASEHOLD_)."
        ),
    )
    timeout_seconds = models.PositiveIntegerField(
        default=30, help_text="Provider call timeout in seconds (1 to 3600)."
    )
    max_output_tokens = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Anthropic: the most tokens one answer may hold (the Messages API's max_tokens, "
        f"1 to {MAX_OUTPUT_TOKENS}); empty: 4096. Not sent to other providers.",
    )
    system_prompt = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True, help_text="Allowed tool names; empty = all.")
    max_iterations = models.PositiveSmallIntegerField(
        default=10, help_text="Model rounds before the run is truncated (capped by MAX_ITERATIONS)."
    )
    require_second_approver = models.BooleanField(
        default=False, help_text="Four-eyes: the initiator may deny but not approve their own run."
    )
    preview_is_snapshot = models.BooleanField(
        default=False,
        help_text="Off (the default): before an approved write with a preview runs, its preview "
        "is made again, and if it changed the call does not run and waits for approval again. "
        "On: the preview is only a snapshot captured when the run paused.",
    )
    approver_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        # A group named here cannot be deleted: losing it must not lift the restriction.
        on_delete=models.PROTECT,
        related_name="+",
        help_text=(
            "Only members of this group may approve this configuration's runs or say whether an "
            "in-doubt call landed (beside the permissions those need). Empty: no group needed."
        ),
    )
    approval_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text=(
            "How long a run may wait for approval or input (e.g. 00:30:00 for 30 minutes, "
            "1 00:00:00 for a day); empty: no deadline. Fixed when the run starts waiting; the "
            "reaper settles it once passed (on_approval_timeout)."
        ),
    )
    on_approval_timeout = models.CharField(
        max_length=8,
        choices=ApprovalTimeoutAction.choices,
        default=ApprovalTimeoutAction.DENY,
        help_text="What happens at the deadline: deny the turn and continue, fail the run, or "
        "escalate: hand it to the escalation group with a second deadline.",
    )
    escalation_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        # Named here, it cannot be deleted: an escalation must always have someone to go to.
        on_delete=models.PROTECT,
        related_name="+",
        help_text="With on_approval_timeout = escalate: who is asked at the deadline. Its members "
        "are notified at once and may decide (beside the approver group), with the tools' "
        "permissions as always.",
    )
    escalation_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text="With on_approval_timeout = escalate: how long the escalation group has, from "
        "the first deadline (e.g. 04:00:00 for four hours).",
    )
    on_escalation_timeout = models.CharField(
        max_length=8,
        choices=[(action.value, action.label) for action in FINAL_TIMEOUT_ACTIONS],
        default=ApprovalTimeoutAction.DENY,
        blank=True,  # a form that does not show it keeps the default (``clean``)
        help_text="What happens when the escalation group did not decide either: deny or fail.",
    )
    script = models.JSONField(
        default=list, blank=True, help_text="Turns for the scripted provider."
    )
    output_schema = models.JSONField(
        null=True,
        blank=True,
        help_text="Optional: a JSON schema (an object schema, as for tool arguments) the final "
        "answer must match as JSON. An answer that does not is sent back once with what failed; "
        "a second ends the run failed (bad_output). Empty: the answer is free text.",
    )
    notify_webhook_url = models.URLField(
        max_length=2048,
        blank=True,
        help_text=(
            "Optional: when a run of this configuration waits for a person, POST a "
            'Slack-compatible {"text": …} here (at most once per AGENTRUNS NOTIFY_INTERVAL). '
            "Its host must be in AGENTRUNS['WEBHOOK_ALLOWLIST']."
        ),
    )
    allow_chat_approval = models.BooleanField(
        default=False,
        help_text="Let people approve this configuration's runs from chat (the Slack buttons of "
        "the webhook's message), for turns whose previews did not fail. Off: chat offers Deny "
        "and Open only.",
    )
    is_active = models.BooleanField(default=True)
    # Whether a standing approval was made and not revoked since (services.approval_rules keeps
    # it): a segment looks for rules only when it is set, so a configuration without rules pays
    # no statement for them (docs/design.md §5.13). Live, never versioned.
    has_standing_rules = models.BooleanField(default=False, editable=False)
    # Cost (agentruns.budgets): prices in AGENTRUNS["COST_CURRENCY"]; empty = not priced.
    price_per_million_prompt_tokens = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Price of a million prompt tokens (AGENTRUNS['COST_CURRENCY']); empty: unpriced.",
    )
    price_per_million_completion_tokens = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Price of a million completion tokens; empty: unpriced.",
    )
    daily_budget = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Most this configuration's runs may spend per UTC day; empty: no budget. A run "
        "over it ends failed (budget exhausted) before its next model call.",
    )
    max_tokens_per_call = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="The most tokens one model call can use, prompt and answer together: the "
        "model's context window. With a budget, each call in flight holds this many tokens at "
        "the higher price until its answer is charged, so runs racing for the last of a budget "
        "overspend it by at most one call. Empty: a call holds the day's largest call (an "
        "estimate, not a bound).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(price_per_million_prompt_tokens__gte=0)
                & Q(price_per_million_completion_tokens__gte=0)
                & Q(daily_budget__gte=0),
                name="agentconfiguration_cost_not_negative",
                violation_error_message="Prices and budgets cannot be negative.",
            ),
            models.CheckConstraint(
                condition=Q(max_tokens_per_call__gte=1),
                name="agentconfiguration_max_tokens_per_call_positive",
                violation_error_message="A call's token bound must be at least 1.",
            ),
        ]

    #: On the copy ``agentruns.versions.pinned_configuration`` makes for a run: the version it
    #: shows (such a copy is never saved). ``None`` on the live row.
    pinned_version: PinnedValues | None = None
    #: Who is changing the row (the admin sets it before saving): the new version's author.
    changed_by: Any = None

    def __str__(self) -> str:
        return self.name or self.slug

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, then record the version of what was saved (``services.versions``: a new one
        only when a pinned field changed), in one transaction. A pinned view refuses."""
        if self.pinned_version is not None:
            raise RuntimeError(f"{self.slug}: a run's pinned view of a configuration is not saved")
        from django.db import transaction

        from agentruns.services.versions import configuration_version_record
        from agentruns.versions import PINNED_FIELDS

        update_fields = kwargs.get("update_fields")
        with transaction.atomic():
            super().save(*args, **kwargs)
            if update_fields is None or set(update_fields) & set(PINNED_FIELDS):
                configuration_version_record(configuration=self, created_by=self.changed_by)

    def clean(self) -> None:
        """Refuses what a run could not use or the database could not store: a timeout outside
        1 … ``MAX_TIMEOUT_SECONDS`` s, a round cap outside 1 … ``MAX_ROUND_CAP``, an answer's
        token bound outside 1 … ``MAX_OUTPUT_TOKENS`` or above the call's, a deadline
        past ``MAX_APPROVAL_TIMEOUT``, JSON (``tools``, ``script``, ``output_schema``) holding
        NUL, lone surrogates or numbers that are not finite, a script the scripted provider
        would refuse and an output schema ``tools.schemas.check_schema`` refuses."""
        errors: dict[str, str] = {}
        self._check_bounds(errors)
        self._check_json(errors)
        if self.api_key_env:
            problem = secret_env_problem(self.api_key_env)
            if problem is not None:
                errors["api_key_env"] = problem
        self._check_deadline(errors)
        self._check_webhook(errors)
        if errors:
            raise ValidationError(errors)

    def _check_bounds(self, errors: dict[str, str]) -> None:
        """The timeout, the round cap and the deadline within their bounds."""
        if self.timeout_seconds is not None and not (
            1 <= self.timeout_seconds <= MAX_TIMEOUT_SECONDS
        ):
            errors["timeout_seconds"] = f"A provider timeout is 1 to {MAX_TIMEOUT_SECONDS} seconds."
        if self.max_iterations is not None and not 1 <= self.max_iterations <= MAX_ROUND_CAP:
            # The column's bound on every database (SQLite would store more); runs stop at
            # AGENTRUNS["MAX_ITERATIONS"] whatever this says.
            errors["max_iterations"] = f"A round cap is 1 to {MAX_ROUND_CAP}."
        self._check_output_tokens(errors)
        if self.approval_timeout is not None and self.approval_timeout > MAX_APPROVAL_TIMEOUT:
            errors["approval_timeout"] = (
                f"A deadline is at most {MAX_APPROVAL_TIMEOUT.days} days away."
            )

    def _check_output_tokens(self, errors: dict[str, str]) -> None:
        """An answer's bound within 1 … ``MAX_OUTPUT_TOKENS`` and within the call's bound (an
        answer is part of the call: prompt and answer together)."""
        bound = self.max_output_tokens
        if bound is None:
            return
        if not 1 <= bound <= MAX_OUTPUT_TOKENS:
            errors["max_output_tokens"] = f"An answer's bound is 1 to {MAX_OUTPUT_TOKENS} tokens."
        elif self.max_tokens_per_call is not None and bound > self.max_tokens_per_call:
            errors["max_output_tokens"] = (
                f"An answer cannot hold more tokens than the whole call ({self.max_tokens_per_call}"
                ", max_tokens_per_call)."
            )

    def _check_json(self, errors: dict[str, str]) -> None:
        """``tools``, ``script`` and ``output_schema`` storable, the script one the scripted
        provider plays, the output schema one the bounded validator checks."""
        for name in ("tools", "script", "output_schema"):
            if (problem := json_problem(getattr(self, name))) is not None:
                errors[name] = f"This JSON cannot be stored: {problem}."
        if "script" not in errors and (self.script or self.provider == Provider.SCRIPTED):
            from agentruns.providers.base import ProviderError
            from agentruns.providers.scripted import validate_script

            try:
                validate_script(self.script)
            except ProviderError as exc:
                errors["script"] = str(exc)
        if "output_schema" not in errors and self.output_schema is not None:
            from agentruns.tools.schemas import InvalidSchema, check_schema

            try:
                check_schema(self.output_schema, what="output_schema")
            except InvalidSchema as exc:
                errors["output_schema"] = str(exc)

    def _check_deadline(self, errors: dict[str, str]) -> None:
        if self.approval_timeout is not None and self.approval_timeout <= timedelta(0):
            errors["approval_timeout"] = "A deadline must be a positive duration (or empty: none)."
        if self.on_approval_timeout not in ApprovalTimeoutAction.values:
            errors["on_approval_timeout"] = "Choose deny, fail or escalate."
        if not self.on_escalation_timeout:
            self.on_escalation_timeout = ApprovalTimeoutAction.DENY
        if self.on_escalation_timeout not in FINAL_TIMEOUT_ACTIONS:
            errors["on_escalation_timeout"] = "Choose deny or fail."
        self._check_escalation(errors)

    def _check_escalation(self, errors: dict[str, str]) -> None:
        """Escalating needs a deadline to escalate at, a group to escalate to and a second
        deadline, positive and within ``MAX_APPROVAL_TIMEOUT``."""
        timeout = self.escalation_timeout
        if timeout is not None and not timedelta(0) < timeout <= MAX_APPROVAL_TIMEOUT:
            errors["escalation_timeout"] = (
                f"A second deadline is a positive duration, at most {MAX_APPROVAL_TIMEOUT.days} "
                "days away."
            )
        if self.on_approval_timeout != ApprovalTimeoutAction.ESCALATE:
            return
        if self.approval_timeout is None:
            errors.setdefault("approval_timeout", "Escalating needs a deadline to escalate at.")
        if self.escalation_group_id is None:
            errors["escalation_group"] = "Escalating needs a group to escalate to."
        if timeout is None:
            errors.setdefault("escalation_timeout", "Escalating needs a second deadline.")

    def _check_webhook(self, errors: dict[str, str]) -> None:
        if self.notify_webhook_url:
            from agentruns.conf import app_settings
            from agentruns.outbound import WebhookRefused, webhook_target

            try:
                webhook_target(self.notify_webhook_url, list(app_settings().webhook_allowlist))
            except WebhookRefused as refused:
                errors["notify_webhook_url"] = str(refused)
