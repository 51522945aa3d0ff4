"""What the run services share: who acts, a run's id from its uuid, the claim hook."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError

from agentruns.exceptions import RunNotFound
from agentruns.leases import Lease
from agentruns.models import AgentRun

User = AbstractBaseUser | AnonymousUser
# Called with the lease of an inline segment before it runs (the playground's stream keeps it
# to settle the run ``abandoned`` if its client goes away: ``run_abandon``).
ClaimHook = Callable[[Lease], None]


def user_id(user: User | None) -> int | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return user.pk


def run_id_of(run_uuid: UUID | str, *, missing_ok: bool = False) -> int | None:
    try:
        run_id = AgentRun.objects.filter(uuid=run_uuid).values_list("pk", flat=True).first()
    except (ValidationError, ValueError):
        run_id = None
    if run_id is None and not missing_ok:
        raise RunNotFound()
    return run_id
