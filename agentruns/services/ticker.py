"""The background heartbeat that keeps a lease alive while a provider or tool call is in flight.

It renews every third of the lease on its own database connection (closed when it stops). A
renewal that matches no row marks the lease lost; the segment checks ``lost`` after the call
and stops before its next side effect (RUNS.md §4).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from django.db import connections

from agentruns import conf, transitions
from agentruns.exceptions import StateWriteFailed

logger = logging.getLogger(__name__)


class LeaseTicker:
    """Context manager: renew ``lease`` every ``LEASE_SECONDS / 3`` until the block ends."""

    def __init__(self, lease: transitions.Lease, *, interval: float | None = None) -> None:
        self.lease = lease
        self.interval = interval if interval is not None else conf.get("LEASE_SECONDS") / 3
        self.lost = False
        self.renewals = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseTicker:
        self._thread = threading.Thread(
            target=self._run, name=f"lease-ticker-{self.lease.run_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    renewed = transitions.run_heartbeat(self.lease)
                except StateWriteFailed:
                    logger.warning("lease renewal failed for run %s; will retry", self.lease.uuid)
                    continue
                if not renewed:
                    logger.warning("run %s: lease lost during a call", self.lease.uuid)
                    self.lost = True
                    return
                self.renewals += 1
        finally:
            connections.close_all()
