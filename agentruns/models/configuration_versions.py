"""``ConfigurationVersion``: an immutable snapshot of what of an ``AgentConfiguration`` governs a
run's execution (docs/configuration-versions.md). A run pins the version it started with.

Rows are written only by ``agentruns.services.versions`` (numbered 1, 2, 3… per configuration,
never twice the same number) and never changed; the snapshot is read and written only by
``agentruns.versions``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from agentruns.models.configuration import AgentConfiguration


class ConfigurationVersion(models.Model):
    """One version of a configuration: ``number`` (1, 2, 3… per configuration), ``snapshot``
    (the pinned fields as JSON, ``agentruns.versions.PINNED_FIELDS``), ``content_hash`` (SHA-256
    of the canonical snapshot), who made the change when known, and when. Never updated."""

    configuration = models.ForeignKey(
        AgentConfiguration, on_delete=models.CASCADE, related_name="versions"
    )
    number = models.PositiveIntegerField()
    snapshot = models.JSONField()
    content_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        ordering = ["configuration", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["configuration", "number"], name="configurationversion_unique_number"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.configuration_id} v{self.number}"

    @property
    def label(self) -> str:
        """How every interface names it: ``v3``."""
        return f"v{self.number}"
