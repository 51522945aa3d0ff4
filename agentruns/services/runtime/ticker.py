"""The background heartbeat that keeps a lease alive while a provider or tool call is in flight.

``LeaseTicker`` renews its lease every third of the lease while its block runs. A renewal that
matches no row marks the lease lost; the segment checks ``lost`` after the call and stops
before its next side effect (docs/design.md §3.3).

The renewals are made by one daemon thread per process (``_Scheduler``), on its own database
connection, closed after each batch of renewals. Entering and leaving a ticker only registers
and unregisters the lease: no thread is started per call, which under CPU contention cost
milliseconds per provider or tool call (``benchmarks/step_overhead.py``). Leaving waits for a
renewal of that lease already in flight, so ``lost`` is final once the block has ended.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType

from django.db import connections

from agentruns import transitions
from agentruns.conf import app_settings
from agentruns.exceptions import StateWriteFailed
from agentruns.leases import Lease

logger = logging.getLogger(__name__)


# Renewals made in this process not yet written to /metrics' counter, per lease (run id, epoch);
# the key ``None`` holds renewals put back after a failed write, for whichever segment ends next.
_tally_lock = threading.Lock()
_renewals_untold: dict[tuple[int, int] | None, int] = {}


def _key(lease: Lease) -> tuple[int, int]:
    return (lease.run_id, lease.epoch)


def count_renewal(lease: Lease) -> None:
    with _tally_lock:
        _renewals_untold[_key(lease)] = _renewals_untold.get(_key(lease), 0) + 1


def take_renewals(lease: Lease | None = None) -> int:
    """The renewals of ``lease`` not written yet, plus any put back after a failed write, and
    forget them (``metrics.record_segment_end`` writes them once per segment: no statement per
    heartbeat). ``lease=None``: only those put back."""
    with _tally_lock:
        taken = _renewals_untold.pop(None, 0)
        if lease is not None:
            taken += _renewals_untold.pop(_key(lease), 0)
    return taken


def give_back_renewals(n: int) -> None:
    """Put back renewals whose write failed, for the next segment's write."""
    if n <= 0:
        return
    with _tally_lock:
        _renewals_untold[None] = _renewals_untold.get(None, 0) + n


class LeaseTicker:
    """Context manager: renew ``lease`` every ``LEASE_SECONDS / 3`` until the block ends."""

    def __init__(self, lease: Lease, *, interval: float | None = None) -> None:
        self.lease = lease
        self.interval = interval if interval is not None else app_settings().lease_seconds / 3
        self.lost = False
        self.renewals = 0

    def __enter__(self) -> LeaseTicker:
        _scheduler.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _scheduler.remove(self)

    def _beat(self) -> bool:
        """One renewal, on the scheduler's thread. ``False``: stop renewing (the lease is lost)."""
        try:
            renewed = transitions.run_heartbeat(self.lease)
        except StateWriteFailed:
            logger.warning("lease renewal failed for run %s; will retry", self.lease.uuid)
            return True
        except Exception:
            logger.exception("lease renewal raised for run %s; will retry", self.lease.uuid)
            return True
        if not renewed:
            logger.warning("run %s: lease lost during a call", self.lease.uuid)
            self.lost = True
            return False
        self.renewals += 1
        count_renewal(self.lease)
        return True


class _Scheduler:
    """One daemon thread renewing every registered ticker when it is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[LeaseTicker, float] = {}  # ticker -> monotonic time of its next renewal
        self._beating: LeaseTicker | None = None
        # When the thread plans to wake (``None``: not started yet); ``add`` wakes it only for
        # a ticker due before that.
        self._wake_at: float | None = None
        self._thread: threading.Thread | None = None

    def add(self, ticker: LeaseTicker) -> None:
        due = time.monotonic() + ticker.interval
        with self._cond:
            self._due[ticker] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-ticker", daemon=True)
                self._thread.start()
            elif self._wake_at is None or due < self._wake_at:
                self._cond.notify()

    def remove(self, ticker: LeaseTicker) -> None:
        with self._cond:
            self._due.pop(ticker, None)
            while self._beating is ticker:
                self._cond.wait()

    def _next_due(self) -> list[LeaseTicker]:
        """Wait (holding the condition) until some ticker is due; return those that are."""
        while True:
            now = time.monotonic()
            due = [ticker for ticker, at in self._due.items() if at <= now]
            if due:
                self._wake_at = now
                return due
            # Idle, the thread still wakes every default interval: a ticker registered with
            # that interval (every provider and tool call) is then never due before the planned
            # wake, and ``add`` need not wake the thread for it (a thread switch per call).
            self._wake_at = (
                min(self._due.values()) if self._due else now + app_settings().lease_seconds / 3
            )
            self._cond.wait(self._wake_at - now)

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._next_due()
            try:
                for ticker in due:
                    with self._cond:
                        if ticker not in self._due:
                            continue  # its block ended meanwhile
                        self._beating = ticker
                    keep = True
                    try:
                        keep = ticker._beat()
                    finally:
                        with self._cond:
                            self._beating = None
                            if ticker in self._due:
                                if keep:
                                    self._due[ticker] = time.monotonic() + ticker.interval
                                else:
                                    del self._due[ticker]
                            self._cond.notify_all()
            finally:
                connections.close_all()


_scheduler = _Scheduler()


def _reset_after_fork() -> None:
    # A forked child inherits the registrations and possibly a held lock, but not the thread.
    global _scheduler, _renewals_untold, _tally_lock
    _scheduler = _Scheduler()
    # The parent's untold renewals are the parent's to write (and its lock may be held).
    _tally_lock = threading.Lock()
    _renewals_untold = {}


os.register_at_fork(after_in_child=_reset_after_fork)
