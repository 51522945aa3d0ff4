"""django-q2 entry points. Each loads a uuid (or nothing) and calls one service."""

from __future__ import annotations

from agentruns.conf import app_settings
from agentruns.services import (
    notifications,
    reaper,
    reconciliation,
    retention,
    runs,
    scheduled_runs,
)


def process_run(run_uuid: str) -> str:
    """Claim a queued run and continue it; a no-op when the claim finds nothing to do."""
    result = runs.run_process_queued(run_uuid=run_uuid, reload_run=False)
    return "not claimed" if result is None else result.outcome


def purge_old_runs() -> str:
    """The scheduled retention pass (``setup_schedules`` with ``RETENTION_DAYS``); returns its
    summary line. Does nothing when retention was switched off after the schedule was made."""
    days = app_settings().retention_days
    if days <= 0:
        return "retention is off (AGENTRUNS_RETENTION_DAYS is 0)"
    return retention.runs_purge(older_than_days=days).summary()


def reap_stale_runs() -> str:
    """The scheduled reaper pass (``setup_schedules``); returns its summary line."""
    return reaper.reap_stale_runs().summary()


def check_in_doubt(run_uuid: str, attempt: int = 1) -> str:
    """A tool's automatic check of a run's in-doubt write; a no-op when nothing is due."""
    return reconciliation.run_check_in_doubt(run_uuid=run_uuid, attempt=int(attempt))


def notify_waiting() -> str:
    """The scheduled notification pass (``setup_schedules`` with ``NOTIFY_INTERVAL`` above 0);
    returns its summary line. Duplicates are harmless: each recipient's digest is claimed."""
    return notifications.notifications_send().summary()


def notify_escalated(run_uuid: str) -> str:
    """Tell the group a run's wait was escalated to, at once (``deadline_sweep``); returns a
    summary line. Harmless twice: a person told already is not told again."""
    return notifications.notify_escalated(run_uuid=run_uuid).summary()


def start_scheduled_runs() -> str:
    """The scheduled pass over run schedules (``setup_schedules``, every minute); returns its
    summary line. Harmless twice for one tick: each due time starts one run."""
    return scheduled_runs.schedules_start_due().summary()
