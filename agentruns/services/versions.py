"""Writing configuration versions (docs/configuration-versions.md): the one place that inserts a
``ConfigurationVersion``.

``configuration_version_record`` is idempotent on content (the configuration's pinned fields
unchanged since its latest version: that version, nothing written) and race-safe: the number is
the latest plus one, the unique ``(configuration, number)`` refuses a second row with it, and the
loser reads again and retries (two concurrent edits get two numbers; two concurrent saves of the
same content get one version).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import IntegrityError, transaction

from agentruns import versions
from agentruns.models import AgentConfiguration, ConfigurationVersion

#: How often a version insert that lost a race for its number reads again and retries.
RECORD_ATTEMPTS = 8


class VersionRaceLost(Exception):
    """Every attempt to number a new version lost its race (``RECORD_ATTEMPTS``)."""


def _latest(configuration_id: int) -> ConfigurationVersion | None:
    return (
        ConfigurationVersion.objects.filter(configuration_id=configuration_id)
        .order_by("-number")
        .first()
    )


def configuration_version_record(
    *, configuration: AgentConfiguration, created_by: Any = None
) -> ConfigurationVersion:
    """The version of ``configuration`` as it stands in memory (its ``PINNED_FIELDS``): its
    latest version when that holds the same content, else a new one numbered after it, made by
    ``created_by`` (a user, or ``None`` when not known). Raises ``VersionRaceLost`` after
    ``RECORD_ATTEMPTS`` lost races; an enclosing transaction stays usable (each insert is its
    own savepoint)."""
    if configuration.pinned_version is not None:
        raise ValueError("a pinned view of a configuration has no versions of its own")
    snapshot = versions.snapshot_of(configuration)
    digest = versions.content_hash(snapshot)
    author_id = created_by.pk if getattr(created_by, "is_authenticated", False) else None
    for _ in range(RECORD_ATTEMPTS):
        latest = _latest(configuration.pk)
        if latest is not None and latest.content_hash == digest:
            return latest
        try:
            with transaction.atomic():
                made = ConfigurationVersion.objects.create(
                    configuration_id=configuration.pk,
                    number=(latest.number if latest is not None else 0) + 1,
                    snapshot=snapshot,
                    content_hash=digest,
                    created_by_id=author_id,
                )
        except IntegrityError:
            continue  # another writer took that number: read again
        # Cached once committed: a rolled-back row's id may be reused (SQLite).
        transaction.on_commit(partial(versions.remember, made), robust=True)
        return made
    raise VersionRaceLost(f"configuration {configuration.pk}: no free version number")
