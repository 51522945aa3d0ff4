"""Streaming a segment to a browser as NDJSON, and settling it ``abandoned`` if the browser leaves.

``RunStream`` is the body of a ``StreamingHttpResponse``. On the first ``next()`` it starts the
segment in a background thread (``start(observer=..., on_claim=...)``, one ``agentruns`` service
call); the segment's observer hands each committed event to the response through a queue, so a
step is written the moment its boundary committed. The body ends with exactly one terminal line
(``end`` or ``error``).

The segment runs inside ``token_stream.watching``: a provider that streams sends the text of
each answer as it is written, and the body writes it as ``tokens`` lines (``call``: the model
call's number in this stream; ``start`` on its first line; ``text``; ``dropped``: characters a
slow browser did not get; ``end``: ``answered`` or ``failed``), in order with the steps
(``live_tokens``). The answer's ``llm`` step follows its tokens; a call that failed has none.

While nothing is recorded the body looks at the run's lease every ``HEARTBEAT_POLL_SECONDS``:
a renewal by the segment's heartbeat (its lease renewed while a call runs, nothing else changed)
is written as a ``heartbeat`` line the moment it is seen (``heartbeat_line``).

If the client goes away the WSGI server closes the body: ``close()`` then settles the run
``failed`` / ``abandoned`` under the segment's own lease (``runs.run_abandon``), and the segment
thread, whose next boundary write matches nothing, stops (lease lost). A write in flight is never
cut off: with the fence stamped the abandon is refused and retried by the observer at the
segment's next boundary, after the write's own event was recorded.
"""

from __future__ import annotations

import copy
import json
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from agentruns import selectors
from agentruns.exceptions import LeaseholdError
from agentruns.leases import EventSpec, Lease
from agentruns.services import runs
from agentruns.services.runtime import token_stream
from agentruns.services.runtime.results import EventObserver, SegmentResult
from playground.live_tokens import LiveTokens

logger = logging.getLogger(__name__)

Start = Callable[..., SegmentResult]
THREAD_PREFIX = "playground-stream"
HEARTBEAT_POLL_SECONDS = 1.0


class RunStream:
    """An iterator of NDJSON lines (bytes) for one segment; see the module docstring.

    ``step_line(spec, run_uuid)``, ``end_line(result)`` and ``error_line(exc)`` turn what the
    segment produced into the JSON objects written (rendered in the response's thread);
    ``heartbeat_line(lease, lease_expires)`` a renewal of its lease seen in the row (None: no
    heartbeat lines).
    """

    def __init__(
        self,
        start: Start,
        *,
        step_line: Callable[[EventSpec, str], dict[str, Any]],
        end_line: Callable[[SegmentResult], dict[str, Any]],
        error_line: Callable[[Exception], dict[str, Any]],
        heartbeat_line: Callable[[Lease, Any], dict[str, Any]] | None = None,
    ) -> None:
        self._start = start
        self._step_line = step_line
        self._end_line = end_line
        self._error_line = error_line
        self._heartbeat_line = heartbeat_line
        # The lease as last seen: (lease_expires, lease_epoch, next_sequence, pending_effect).
        self._seen: tuple[Any, ...] | None = None
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        # The text of streamed model calls, queued in order with the steps (``live_tokens``).
        self._tokens = LiveTokens(lambda batch: self._queue.put(("tokens", batch)))
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._client_gone = False
        self._abandoned = False
        self._finished = False
        self.thread: threading.Thread | None = None

    # -- the response's side ------------------------------------------------------------------

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> bytes:
        if self._finished:
            raise StopIteration
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name=THREAD_PREFIX, daemon=True)
            self.thread.start()
        while True:
            try:
                kind, item = self._queue.get(timeout=HEARTBEAT_POLL_SECONDS)
                break
            except queue.Empty:
                beat = self._heartbeat()
                if beat is not None:
                    return (json.dumps({"event": "heartbeat", **beat}, default=str) + "\n").encode()
        if kind == "tokens":
            line = {"event": "tokens", "run": self._run_uuid(), **self._tokens.take(item)}
        elif kind == "step":
            spec, run_uuid = item
            self._seen = None  # a step moves the lease too: look afresh from here
            line = {"event": "step", **self._step_line(spec, run_uuid)}
        elif kind == "end":
            self._finished = True
            line = {"event": "end", **self._end_line(item)}
        else:
            self._finished = True
            line = {"event": "error", **self._error_line(item)}
        return (json.dumps(line, default=str) + "\n").encode()

    def _heartbeat(self) -> dict[str, Any] | None:
        """A ``heartbeat`` line when the lease was renewed since it was last seen and nothing
        else moved (no event appended, no fence stamped or cleared, the same epoch); else None
        (the first look only remembers what it saw)."""
        with self._lock:
            lease = self._lease
        if self._heartbeat_line is None or lease is None:
            return None
        now = selectors.run_lease(run_id=lease.run_id)
        seen, self._seen = self._seen, now
        if now is None or seen is None or now[1] != lease.epoch:
            return None
        if now[0] == seen[0] or now[1:] != seen[1:]:
            return None
        return self._heartbeat_line(lease, now[0])

    def _run_uuid(self) -> str:
        with self._lock:
            return str(self._lease.uuid) if self._lease else ""

    def close(self) -> None:
        """Called by the server when the body is done or the client went away."""
        if self._finished or self.thread is None:
            return  # ended normally, or never started: no run was created
        with self._lock:
            self._client_gone = True
        self._try_abandon()

    # -- the segment's side (background thread) -------------------------------------------------

    def _try_abandon(self) -> None:
        with self._lock:
            lease = self._lease
            if lease is None or self._abandoned or not self._client_gone:
                return
        if runs.run_abandon(lease=lease):
            with self._lock:
                self._abandoned = True
            logger.info("run %s abandoned: the client went away mid-stream", lease.uuid)

    def _on_claim(self, lease: Lease) -> None:
        with self._lock:
            self._lease = lease
        self._try_abandon()  # the client may have gone before the run existed

    def _observe(self, spec: EventSpec) -> None:
        with self._lock:
            lease = self._lease
        # A copy taken now: the segment keeps mutating what its payloads refer to (the dialogue).
        snapshot = copy.deepcopy(spec)
        self._queue.put(("step", (snapshot, str(lease.uuid) if lease else "")))
        # A boundary just committed: the fence (if any) is clear, so an abandon refused while a
        # write was in flight succeeds now.
        self._try_abandon()

    def _work(self) -> None:
        observer: EventObserver = self._observe
        terminal: tuple[str, Any] = ("error", RuntimeError("the segment ended without a result"))
        try:
            with token_stream.watching(self._tokens):
                terminal = ("end", self._start(observer=observer, on_claim=self._on_claim))
        except LeaseholdError as exc:
            terminal = ("error", exc)
        except Exception as exc:
            logger.exception("playground stream failed")
            terminal = ("error", exc)
        finally:
            connections.close_all()
            self._queue.put(terminal)  # always exactly one terminal item: the body never hangs
