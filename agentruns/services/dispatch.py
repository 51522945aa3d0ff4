"""Wake-ups: django-q2 tasks that carry only a run's uuid (docs/design.md §10.1).

The row is the state; a task is a hint that a run may be claimable. Duplicates and stale tasks
are harmless because the worker's first act is a conditional claim.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentruns.conf import app_settings
from agentruns.models import AgentRun
from agentruns.tools import Tool
from agentruns.turns import CheckStatus

logger = logging.getLogger(__name__)

TASK = "agentruns.tasks.process_run"
#: A tool's automatic check of an in-doubt write (docs/design.md §9.2): ``(run_uuid, attempt)``.
CHECK_TASK = "agentruns.tasks.check_in_doubt"


class _HeldTasks:
    """Stands in for django-q2's ORM broker inside ``batched_wakeups``: ``enqueue`` keeps the
    signed task instead of inserting its row, and answers what django-q2 logs as the task's id
    ("Enqueued [leasehold] held 1 of this batch's wake-ups"), the row having none yet."""

    def __init__(self, list_key: str) -> None:
        self.list_key = list_key
        self.packages: list[str] = []

    def enqueue(self, package: str) -> str:
        self.packages.append(package)
        return f"held {len(self.packages)} of this batch's wake-ups"


_held: ContextVar[_HeldTasks | None] = ContextVar("agentruns_held_wakeups", default=None)


@contextmanager
def batched_wakeups() -> Iterator[None]:
    """Within it, ``send_wakeup`` (without a delay) builds each task as usual but, with the ORM
    broker, holds its row; leaving the block without an error writes them all in one INSERT,
    exactly the rows the broker's ``enqueue`` would have written. Use it inside a transaction:
    the rows are part of it. If the block raises, nothing held is written. Other brokers send at
    once, as outside it.
    """
    from django_q.brokers import get_broker
    from django_q.brokers.orm import ORM
    from django_q.conf import Conf
    from django_q.models import OrmQ

    broker = get_broker()
    if not isinstance(broker, ORM) or _held.get() is not None:
        yield
        return
    held = _HeldTasks(broker.list_key or Conf.CLUSTER_NAME)
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
    if held.packages:
        now = timezone.now()
        OrmQ.objects.using(Conf.ORM).bulk_create(
            [OrmQ(key=held.list_key, payload=package, lock=now) for package in held.packages]
        )


def send_wakeup(run_uuid: str, *, delay_seconds: float = 0) -> None:
    """Send the task now (or as a one-off schedule ``delay_seconds`` from now). May raise."""
    from django_q.models import Schedule
    from django_q.tasks import async_task

    if delay_seconds <= 0:
        # In a transaction: outside one, django-q2's ORM broker calls close_old_connections()
        # first, which with CONN_MAX_AGE=0 reconnects to the database for every task sent.
        # (No savepoint of its own: inside a caller's transaction it is simply part of it.)
        held = _held.get()
        options: dict[str, Any] = {"broker": held} if held is not None else {}
        with transaction.atomic(savepoint=False):
            async_task(TASK, str(run_uuid), group="agentruns", **options)
        return
    Schedule.objects.create(
        func=TASK,
        args=repr(str(run_uuid)),
        schedule_type=Schedule.ONCE,
        repeats=-1,  # a ONCE schedule with negative repeats is deleted once it has run
        next_run=timezone.now() + timedelta(seconds=delay_seconds),
    )


def wake_after_commit(run_uuid: str, *, delay_seconds: float = 0) -> None:
    """Send the wake-up once the current transaction commits (at once outside one).

    A failed send is logged, not raised: the run is already queued and the reaper's redispatch
    sends a fresh task to queued runs nobody claimed.
    """

    def send() -> None:
        try:
            send_wakeup(run_uuid, delay_seconds=delay_seconds)
        except Exception:
            logger.exception("could not send the wake-up for run %s; redispatch will", run_uuid)

    transaction.on_commit(send)


def wake_with_commit(run_uuid: str) -> None:
    """A wake-up that commits with the current transaction. With the ORM broker the task row is
    written in it: both commit or neither (a failed send raises and undoes the transaction's
    change). With a broker outside the database it is sent once the transaction commits (sent
    before, a worker could take it while the change is not visible yet); a failed send is then
    logged and the redispatch covers it."""
    from django_q.brokers import get_broker
    from django_q.brokers.orm import ORM

    if isinstance(get_broker(), ORM):
        send_wakeup(run_uuid)
    else:
        wake_after_commit(run_uuid)


def schedule_retry(run: AgentRun, delay_seconds: float) -> None:
    """The worker's retry hook: a delayed wake-up for a requeued run."""
    wake_after_commit(str(run.uuid), delay_seconds=delay_seconds)


# --- Checks of in-doubt writes (docs/design.md §9.2) ----------------------------------------------


def initial_check(tool: Tool | None) -> CheckStatus | None:
    """The check status a run parked in doubt starts with: scheduled when the call's tool
    declares a check and ``RECONCILE_CHECKS`` allows any; ``None`` otherwise (a person decides)."""
    limit = app_settings().reconcile_checks
    if tool is None or tool.check is None or limit < 1:
        return None
    return CheckStatus.scheduled(limit)


def send_check(run_uuid: str, *, attempt: int, delay_seconds: float = 0) -> None:
    """Send the check task now (or as a one-off schedule ``delay_seconds`` from now). May raise."""
    from django_q.models import Schedule
    from django_q.tasks import async_task

    if delay_seconds <= 0:
        with transaction.atomic(savepoint=False):
            async_task(CHECK_TASK, str(run_uuid), attempt, group="agentruns-checks")
        return
    Schedule.objects.create(
        func=CHECK_TASK,
        args=repr((str(run_uuid), attempt))[1:-1],
        schedule_type=Schedule.ONCE,
        repeats=-1,
        next_run=timezone.now() + timedelta(seconds=delay_seconds),
    )


def check_after_commit(run_uuid: str, *, attempt: int = 1, delay_seconds: float = 0) -> None:
    """Send the check task once the current transaction commits. A failed send is logged: the
    run waits for a person, who may decide at any time."""

    def send() -> None:
        try:
            send_check(run_uuid, attempt=attempt, delay_seconds=delay_seconds)
        except Exception:
            logger.exception("could not send the check of run %s; a person decides", run_uuid)

    transaction.on_commit(send)
