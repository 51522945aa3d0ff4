"""Standing approvals (docs/standing_approvals.md): ``ApprovalRule``, a person's answer given in
advance to calls of one tool of one configuration whose arguments match a JSON Schema, until an
expiry and for at most a number of uses; and ``ApprovalRuleEvent``, the append-only audit of
every change to a rule (created, revoked, used).

Written only by ``agentruns.services.approval_rules`` (create, revoke) and
``agentruns.services.standing_approvals`` (a use, under the rule's row lock, with the approval
it gives). A rule is never deleted: it is revoked.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class ApprovalRule(models.Model):
    """One standing approval. Active while not revoked, before ``expires_at`` (database clock)
    and, with ``max_uses``, while ``uses < max_uses``; its author's authority is checked again
    at every use."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    configuration = models.ForeignKey(
        "agentruns.AgentConfiguration", on_delete=models.PROTECT, related_name="approval_rules"
    )
    tool = models.CharField(max_length=200, help_text="The tool's registered name.")
    arguments_schema = models.JSONField(
        help_text="A JSON Schema the call's arguments must satisfy, e.g. "
        '{"properties": {"url": {"const": "https://hooks.example/deploy"}}, "required": ["url"]}.'
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who made it; the approvals it gives are theirs. None (account deleted): it "
        "approves nothing.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(help_text="At most 30 days after its creation.")
    max_uses = models.PositiveIntegerField(
        null=True, blank=True, help_text="Calls it may approve in all (empty: no limit)."
    )
    uses = models.PositiveIntegerField(default=0, help_text="Calls it approved so far.")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["configuration", "tool", "expires_at"],
                name="approvalrule_match",
                condition=models.Q(revoked_at__isnull=True),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_uses__isnull=True)
                | models.Q(uses__lte=models.F("max_uses")),
                name="approvalrule_uses_within_max",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool} on {self.configuration_id} ({str(self.uuid)[:8]})"


class RuleEventKind(models.TextChoices):
    CREATED = "created", "created"
    REVOKED = "revoked", "revoked"
    USED = "used", "approved a turn"


class ApprovalRuleEvent(models.Model):
    """One change to a rule, written in the transaction of the change: ``created`` (the rule as
    made), ``revoked``, ``used`` (the run, the calls it approved, the turn digest)."""

    rule = models.ForeignKey(ApprovalRule, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=16, choices=RuleEventKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_ref = models.CharField(max_length=150, blank=True, help_text="The username then.")
    run_uuid = models.UUIDField(null=True, blank=True)
    calls = models.PositiveIntegerField(default=0)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["kind", "created_at"], name="approvalruleevent_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.rule_id}"
