"""Read-only queries over runs and events.

Every query a person's request makes goes through the visibility rule (docs/design.md §12.1):
a user sees a run they started, or every run when they hold ``agentruns.decide_agentrun`` or
``agentruns.view_all_agentruns`` (superusers hold both); any other run does not exist for them.
The rule is ``_visible``; ``visible_runs``, ``visible_events``, ``run_visible_to`` and every
selector taking a ``user`` apply it. ``user=None`` is the server itself (a management command),
which sees every run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db.models import Count, DateTimeField, ExpressionWrapper, F, Q, QuerySet, Value
from django.db.models.functions import Now

from agentruns.attribution import Attribution, attribute_runs
from agentruns.authority import DECIDE_PERMISSION, VIEW_ALL_PERMISSION, Decider
from agentruns.exceptions import AmbiguousRunId, RunNotFound
from agentruns.models import (
    DEADLINE_STATUSES,
    WAITING_STATUSES,
    AgentConfiguration,
    AgentRun,
    AgentRunEvent,
    ApprovalRule,
    EventKind,
    Status,
)

User = AbstractBaseUser | AnonymousUser

# --- Visibility ----------------------------------------------------------------------------------


def _visible(user: User | None, *, run: str = "") -> Q | None:
    """The visibility rule: ``None`` when ``user`` sees every run, else the condition a run
    (``run=""``) or a row pointing at one (``run="run__"``) must meet."""
    if user is None:
        return None
    if not user.is_authenticated:
        return Q(pk__in=[])
    if sees_every_run(user):
        return None
    return Q(**{f"{run}initiator_id": user.pk})


def sees_every_run(user: User | None) -> bool:
    """Whether ``user`` (a person) may see every run: ``agentruns.decide_agentrun`` or
    ``agentruns.view_all_agentruns``. What counts across all runs (the dashboard) needs it."""
    person = Decider(user)
    return person.has_perm(DECIDE_PERMISSION) or person.has_perm(VIEW_ALL_PERMISSION)


def visible_runs(
    *, user: User | None, queryset: QuerySet[AgentRun] | None = None
) -> QuerySet[AgentRun]:
    """The runs of ``queryset`` (default: every run) that ``user`` may see."""
    queryset = AgentRun.objects.all() if queryset is None else queryset
    condition = _visible(user)
    return queryset if condition is None else queryset.filter(condition)


def visible_events(
    *, user: User | None, queryset: QuerySet[AgentRunEvent] | None = None
) -> QuerySet[AgentRunEvent]:
    """The events of ``queryset`` (default: every event) of runs ``user`` may see."""
    queryset = AgentRunEvent.objects.all() if queryset is None else queryset
    condition = _visible(user, run="run__")
    return queryset if condition is None else queryset.filter(condition)


def run_visible_to(*, user: User | None, run: AgentRun) -> bool:
    """Whether ``user`` may see ``run`` (no query beyond the user's permissions)."""
    condition = _visible(user)
    return condition is None or (
        user is not None and user.is_authenticated and run.initiator_id == user.pk
    )


def run_get(*, run_uuid: UUID | str, user: User | None) -> AgentRun:
    """The run ``user`` asked for, with configuration (and approver group) and initiator joined.

    Raises ``RunNotFound`` when there is no such run or ``user`` may not see it: a run they may
    not see does not exist for them. ``user=None``: the server itself.
    """
    try:
        return visible_runs(
            user=user,
            queryset=AgentRun.objects.select_related(
                "configuration__approver_group", "config_version", "initiator", "escalated_to"
            ),
        ).get(uuid=run_uuid)
    except (AgentRun.DoesNotExist, ValidationError, ValueError):
        raise RunNotFound() from None


#: The shortest start of a run id ``run_uuid_for`` looks up (pages show 8 characters).
MIN_RUN_ID_PREFIX = 4
_HEX = frozenset("0123456789abcdef")


def run_uuid_for(*, text: str) -> UUID:
    """The uuid of the run ``text`` names, for the server's commands (which see every run): a
    whole uuid, or its start — the short id every page shows, ``MIN_RUN_ID_PREFIX`` hex digits
    or more, dashes optional. ``RunNotFound`` when no run matches (or ``text`` is no id);
    ``AmbiguousRunId`` naming some of the runs that do when more than one does."""
    raw = text.strip().lower()
    try:
        whole = UUID(raw)
    except ValueError:
        whole = None
    if whole is not None:
        if AgentRun.objects.filter(uuid=whole).exists():
            return whole
        raise RunNotFound(f"no run {whole}")
    digits = raw.replace("-", "")
    if not (MIN_RUN_ID_PREFIX <= len(digits) <= 32 and set(digits) <= _HEX):
        raise RunNotFound(
            f"not a run id: {text!r} (a run's uuid, or its first {MIN_RUN_ID_PREFIX} or more "
            "hex digits)"
        )
    # The canonical form's start (dashes after 8, 12, 16 and 20 digits): PostgreSQL compares
    # the uuid's text with dashes, other databases without (Django strips them there).
    dashed = "-".join(digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
    found = list(
        AgentRun.objects.filter(uuid__startswith=dashed.rstrip("-"))
        .order_by("created_at")
        .values_list("uuid", flat=True)[:4]
    )
    if not found:
        raise RunNotFound(f"no run's id starts with {digits}")
    if len(found) > 1:
        shown = ", ".join(str(u) for u in found[:3]) + (", …" if len(found) > 3 else "")
        raise AmbiguousRunId(
            f"{text!r} is the start of more than one run ({shown}): give more of its id"
        )
    return found[0]


def runs_by_uuid(*, run_uuids: Iterable[UUID], user: User | None) -> dict[UUID, AgentRun]:
    """The runs of ``run_uuids`` that ``user`` may see, by uuid, with configuration joined (one
    query): what a page needs to name several runs (a batch decision's outcomes). A uuid with
    no such run, or one ``user`` may not see, is absent."""
    uuids = list(run_uuids)
    queryset = AgentRun.objects.filter(uuid__in=uuids).select_related("configuration")
    return {run.uuid: run for run in visible_runs(user=user, queryset=queryset)} if uuids else {}


def run_events(*, run: AgentRun, after: int = -1) -> QuerySet[AgentRunEvent]:
    return run.events.filter(sequence__gt=after).select_related("actor").order_by("sequence")


def run_lease(*, run_id: int) -> tuple[Any, ...] | None:
    """``(lease_expires, lease_epoch, next_sequence, pending_effect)`` of the run now, or None
    when it is gone: a watcher (the playground's stream) tells a heartbeat — ``lease_expires``
    moved and nothing else did — from a step. One indexed read."""
    return (
        AgentRun.objects.filter(pk=run_id)
        .values_list("lease_expires", "lease_epoch", "next_sequence", "pending_effect")
        .first()
    )


def stale_runs(*, after: tuple[Any, int] | None = None) -> QuerySet[AgentRun]:
    """Running runs whose lease expired on the database clock, oldest lease first (docs/design.md
    §8.1).

    Served by the ``(status, lease_expires)`` index. ``after`` is a keyset cursor
    ``(lease_expires, pk)``: only runs strictly after it in that order. The caller adds the
    limit and, to act on them, ``select_for_update(skip_locked=True, of=("self",))``.
    """
    queryset = AgentRun.objects.filter(status=Status.RUNNING, lease_expires__lt=Now())
    if after is not None:
        lease_expires, pk = after
        # A range on the index's second column, minus the ties already seen.
        queryset = queryset.filter(lease_expires__gte=lease_expires).exclude(
            lease_expires=lease_expires, pk__lte=pk
        )
    return queryset.select_related("configuration", "config_version").order_by(
        "lease_expires", "pk"
    )


def overdue_waiting_runs() -> QuerySet[AgentRun]:
    """Runs waiting for approval or input past their approval deadline on the database clock
    (docs/design.md §5.11), earliest deadline first. Served by the ``(status,
    approval_deadline)`` index. Never a run waiting for reconciliation. Read without a lock: the
    settle (``transitions.run_expire_waiting``) locks and re-checks each one."""
    return AgentRun.objects.filter(
        status__in=list(DEADLINE_STATUSES), approval_deadline__lt=Now()
    ).order_by("approval_deadline", "pk")


def unclaimed_queued_runs(*, older_than_seconds: float) -> QuerySet[AgentRun]:
    """Queued runs untouched for ``older_than_seconds`` (database clock): nobody claimed them.

    Served by the ``(status, created_at)`` index's leading column; ``updated_at`` is bumped by
    every transition (and by each redispatch), so a run is redispatched at most once per period.
    A run an external agent loop drives is not one: no worker would claim it (docs/external.md).
    """
    cutoff = ExpressionWrapper(
        Now() - Value(timedelta(seconds=older_than_seconds)), output_field=DateTimeField()
    )
    return AgentRun.objects.filter(
        status=Status.QUEUED, updated_at__lt=cutoff, external_framework=""
    ).order_by("updated_at", "pk")


def run_list(
    *,
    user: User | None,
    status: str | None = None,
    configuration: str | None = None,
    initiator_id: int | None = None,
) -> QuerySet[AgentRun]:
    """The runs ``user`` may see, newest first, optionally narrowed to a status, a configuration
    slug, an initiator."""
    queryset = visible_runs(
        user=user,
        queryset=AgentRun.objects.select_related("configuration", "config_version", "initiator"),
    )
    if status:
        queryset = queryset.filter(status=status)
    if configuration:
        queryset = queryset.filter(configuration__slug=configuration)
    if initiator_id is not None:
        queryset = queryset.filter(initiator_id=initiator_id)
    return queryset.order_by("-created_at", "-pk")


# --- The approvals inbox -------------------------------------------------------------------------

INBOX_KINDS: dict[str, str] = {
    "approval": Status.WAITING_FOR_APPROVAL,
    "input": Status.WAITING_FOR_INPUT,
    "reconciliation": Status.WAITING_FOR_RECONCILIATION,
}


def inbox_runs(*, user: User | None, kind: str | None = None) -> QuerySet[AgentRun]:
    """Runs ``user`` may see waiting for a human, oldest first; ``kind`` narrows to one of
    ``INBOX_KINDS``.

    Configuration (with its approver group) and initiator are joined, so rendering a page of
    cards costs no further query per card.
    """
    statuses = [INBOX_KINDS[kind]] if kind in INBOX_KINDS else list(INBOX_KINDS.values())
    return (
        visible_runs(user=user)
        .filter(status__in=statuses)
        .select_related(
            "configuration__approver_group", "config_version", "initiator", "escalated_to"
        )
        .order_by("created_at", "pk")
    )


def inbox_counts(*, user: User | None) -> dict[str, int]:
    """How many runs ``user`` may see wait in each inbox kind (one query)."""
    rows = (
        visible_runs(user=user)
        .filter(status__in=list(INBOX_KINDS.values()))
        .values("status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    by_status = {row["status"]: row["n"] for row in rows}
    return {kind: by_status.get(status, 0) for kind, status in INBOX_KINDS.items()}


def recent_runs(*, user: User | None) -> QuerySet[AgentRun]:
    """Every run ``user`` may see, newest first, with configuration and initiator joined."""
    return (
        visible_runs(user=user)
        .select_related("configuration", "initiator")
        .order_by("-created_at", "-pk")
    )


def run_attributions(*, runs: Iterable[AgentRun]) -> dict[int, Attribution | None]:
    """Approval attribution (docs/design.md §5.6) per run id, for any number of runs in one query.

    Reads every approving ``approval`` event of the given runs and ranks them with
    ``agentruns.attribution``; a run without approvals maps to ``None``.
    """
    initiators = {run.pk: run.initiator_id for run in runs}
    if not initiators:
        return {}
    deciders: dict[int, list[int | None]] = defaultdict(list)
    approvals = AgentRunEvent.objects.filter(
        run_id__in=list(initiators), kind=EventKind.APPROVAL, payload__approved=True
    ).values_list("run_id", "actor_id")
    for run_id, actor_id in approvals:
        deciders[run_id].append(actor_id)
    return attribute_runs(initiators=initiators, deciders=deciders)


def waiting_runs_of(*, configurations: QuerySet[AgentConfiguration]) -> list[UUID]:
    """The uuids of the runs of ``configurations`` waiting for a person."""
    return list(
        AgentRun.objects.filter(
            configuration__in=configurations, status__in=WAITING_STATUSES
        ).values_list("uuid", flat=True)
    )


# --- Standing approvals (docs/standing_approvals.md) -------------------------------------------


def active_rule() -> Q:
    """A rule that may approve now: not revoked, not expired by the database clock, a use left
    and an author. The guard of every use (``services.standing_approvals``)."""
    return Q(revoked_at__isnull=True, expires_at__gt=Now(), author__isnull=False) & (
        Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses"))
    )


def approval_rules(*, active: bool | None = None) -> QuerySet[ApprovalRule]:
    """Standing approvals, newest first, with their configuration and people; ``active``: only
    those that may approve now (``True``) or only the others (``False``)."""
    rules = ApprovalRule.objects.select_related("configuration", "author", "revoked_by")
    if active is not None:
        rules = rules.filter(active_rule()) if active else rules.exclude(active_rule())
    return rules.order_by("-created_at", "-id")
