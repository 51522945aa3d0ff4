"""A worker told to stop hands its segment back (docs/design.md §10.2).

django-q2 stops a cluster on SIGTERM or SIGINT to its main process: the sentinel stops fetching
tasks, lets every worker finish the task it holds — bounded only by the task's ``timeout`` — and
exits. The workers are never told. Left alone, a segment would run on for as many rounds as it
has, and a supervisor's SIGKILL after its own timeout would leave the lease to expire.

``install()`` (from ``AgentrunsConfig.ready``) wraps django-q2's ``Cluster.start``: in the main
process, before the sentinel and its workers are forked, it creates one byte of shared memory
(``multiprocessing.RawValue``: no lock that a killed process could leave held) and puts a
handler in front of django-q2's for SIGTERM and SIGINT that sets the byte, then calls
django-q2's. Every worker inherits the byte (fork). django-q2 offers no hook for a stop: this
is the one place that reaches into it, and without it (another launcher, a django-q2 that
changed) nothing is handed back and leases expire as before.

In a worker:

* ``requested()`` — whether its cluster was told to stop: a read of that byte, no system call.
  The worker's segment asks it at its safe points (before each round and each call) and hands
  its run back there (``Boundaries.hand_back``); a worker that is stopping claims nothing new.
* ``interruptible()`` — around a read tool in flight: once a stop was requested and
  ``STOP_GRACE_SECONDS`` have passed, a short-lived watcher thread sends SIGUSR1 to the main
  thread, whose handler raises ``StopRequested`` inside the read. A read changes nothing, so the
  next worker simply runs it again. Writes, provider calls and step boundaries are never
  interrupted: they finish, and the segment hands back at its next safe point.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from django.db import connection

from agentruns.conf import app_settings

logger = logging.getLogger(__name__)

#: How often the watcher of a read in flight looks at the stop flag.
POLL_SECONDS = 0.1
#: The signal that interrupts a read in the worker's main thread (unused by django-q2).
INTERRUPT = signal.SIGUSR1


class StopRequested(BaseException):
    """Raised inside a read tool in flight when its worker is stopping and the grace is over.

    A ``BaseException``: a tool's ``except Exception`` does not turn it into a result."""


# One byte shared by the cluster's processes (``arm``); ``None`` in any other process.
_flag: Any = None
# The read in flight that SIGUSR1 may interrupt (an ``object()`` token per read), or ``None``.
_reading: object | None = None
_lock = threading.Lock()
_handler_installed = False


def arm() -> None:
    """Create the stop flag in this process; processes forked after this share it."""
    global _flag
    if _flag is None:
        _flag = multiprocessing.RawValue(ctypes.c_byte, 0)


def disarm() -> None:
    """Forget the stop flag (tests): this process is no longer a stoppable worker."""
    global _flag
    _flag = None


def request() -> None:
    """Tell every process sharing the flag that the cluster is stopping."""
    if _flag is not None:
        _flag.value = 1


def requested() -> bool:
    """Whether this process's cluster was told to stop (``False`` outside a cluster)."""
    return _flag is not None and _flag.value != 0


# --- Interrupting a read in flight ------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGUSR1 in the main thread: raise inside the read in flight, if there still is one."""
    global _reading
    if _reading is not None and requested():
        _reading = None  # once per read, even if this raise lands in ``interruptible``'s exit
        raise StopRequested()


def _watch(token: object, done: threading.Event, grace: float, main: int) -> None:
    """The watcher of one read: once a stop is requested and ``grace`` has passed, interrupt
    the main thread — unless the read ended first (``done``, set under the same lock)."""
    noticed: float | None = None
    while not done.wait(POLL_SECONDS):
        if not requested():
            continue
        noticed = noticed if noticed is not None else time.monotonic()
        if time.monotonic() < noticed + grace:
            continue
        with _lock:
            if not done.is_set() and _reading is token:
                signal.pthread_kill(main, INTERRUPT)
        return


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Run a read that a stopping worker may cut off: raises ``StopRequested`` inside the block
    once a stop was requested and ``STOP_GRACE_SECONDS`` have passed. The thread's database
    connection is then closed (a query may have been cut off mid-flight); the next query
    opens a new one. A no-op outside a stoppable worker and off the main thread."""
    global _reading, _handler_installed
    main = threading.main_thread()
    if _flag is None or threading.current_thread() is not main or main.ident is None:
        yield
        return
    if not _handler_installed:
        # Installed once and kept: a SIGUSR1 that arrives after the read ended finds no read
        # and does nothing (restoring the default would let such a late signal kill the
        # process).
        signal.signal(INTERRUPT, _interrupt)
        _handler_installed = True
    token = object()
    done = threading.Event()
    grace = app_settings().stop_grace_seconds
    _reading = token
    watcher = threading.Thread(
        target=_watch, args=(token, done, grace, main.ident), name="stop-watcher", daemon=True
    )
    watcher.start()
    try:
        yield
    except StopRequested:
        if not connection.in_atomic_block:
            connection.close()
        raise
    finally:
        with _lock:
            _reading = None
            done.set()


# --- The cluster's main process -------------------------------------------------------------


def _chain(signum: int) -> None:
    """Put a handler in front of this process's ``signum`` handler: set the flag, then call it."""
    previous = signal.getsignal(signum)

    def handler(number: int, frame: FrameType | None) -> None:
        request()
        if callable(previous):
            previous(number, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    signal.signal(signum, handler)


def _armed_start(start: Callable[[Any], int]) -> Callable[[Any], int]:
    @functools.wraps(start)
    def started(cluster: Any) -> int:
        try:
            arm()
            _chain(signal.SIGTERM)
            _chain(signal.SIGINT)
        except ValueError:  # not the main thread: signals cannot be handled here
            logger.warning("a django-q2 cluster started off the main thread hands nothing back")
        return start(cluster)

    started.leasehold_handback = True  # type: ignore[attr-defined]
    return started


def install() -> None:
    """Wrap django-q2's ``Cluster.start`` so that a cluster told to stop tells its workers.
    Idempotent; does nothing when django-q2's cluster cannot be imported."""
    try:
        from django_q.cluster import Cluster
    except Exception:  # not installed, or it changed: leases expire as before
        logger.warning("django-q2's Cluster not found: workers told to stop hand nothing back")
        return
    if getattr(Cluster.start, "leasehold_handback", False):
        return
    Cluster.start = _armed_start(Cluster.start)
