"""Real processes for crash tests: django-q2 clusters, management commands, a "web" segment.

Every process is started in its own session (``start_new_session``) so that it can be killed
like a crashed machine — SIGKILL to its whole process group — or stopped like a supervisor would
— SIGTERM to the main PID only (django-q2 hangs on a group SIGTERM, DJANGO-Q2.md). They point at
the test's own database: ``process_env()`` builds ``DATABASE_URL`` from the live connection's
settings, so a subprocess sees exactly the rows the test wrote (use
``django_db(transaction=True)`` so they are committed).

``Processes`` (fixture ``processes``) remembers what it started and kills what is left at the
end of the test. ``HoldingServer`` is a local HTTP server that records each request and then
holds it unanswered, so a test can kill the client while the request is in flight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """The URL of the database the test is using right now (the test database)."""
    conf = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("crash tests with real processes need PostgreSQL")
    user = conf.get("USER") or "root"
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    host = conf.get("HOST") or "127.0.0.1"
    port = conf.get("PORT") or "5432"
    return f"postgres://{user}{password}@{host}:{port}/{conf['NAME']}"


def process_env(**overrides: Any) -> dict[str, str]:
    """The environment of a subprocess on the test database; ``overrides`` win (``None`` unsets).

    Defaults suit crash tests: a 2-second lease, one worker per cluster polling every 0.1 s.
    """
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "PYTHONUNBUFFERED": "1",
            "AGENTRUNS_LEASE_SECONDS": "2",
            "Q_WORKERS": "1",
            "Q_QUEUE_LIMIT": "1",
            "Q_POLL": "0.1",
            "LOG_LEVEL": "WARNING",
        }
    )
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


@dataclass
class Proc:
    """A started subprocess: its main PID is also its process group id."""

    name: str
    popen: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill_hard(self) -> None:
        """SIGKILL the whole process group: the machine died, nothing ran a handler."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        _reap_group(self.pid)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM to the main PID only (never the group); SIGKILL the group after ``timeout``.

        Returns the exit code; ``-9`` means it had to be killed.
        """
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill_hard()
        _reap_group(self.pid)
        return self.popen.returncode

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


def _reap_group(pgid: int) -> None:
    """Kill any straggler left in a process group (children outliving their parent)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Processes:
    """Starts subprocesses for one test and kills whatever is still running at its end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[Proc] = []

    def start(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.directory / f"{name}-{len(self.started)}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def manage(self, name: str, *args: str, env: dict[str, str]) -> Proc:
        """Start ``manage.py <args>`` (not waited for)."""
        return self.start(name, [sys.executable, "manage.py", *args], env)

    def qcluster(self, name: str = "qcluster", *, env: dict[str, str]) -> Proc:
        """A real django-q2 cluster (``manage.py qcluster``) on the test database."""
        return self.manage(name, "qcluster", env=env)

    def python(self, name: str, code: str, *, env: dict[str, str]) -> Proc:
        """Python ``code`` run after ``django.setup()`` — e.g. a web process's inline segment."""
        prelude = "import django; django.setup()\n"
        return self.start(name, [sys.executable, "-c", prelude + code], env)

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.alive():
                proc.kill_hard()
            else:
                _reap_group(proc.pid)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """A ``Processes`` whose leftovers are SIGKILLed after the test."""
    manager = Processes(tmp_path)
    try:
        yield manager
    finally:
        manager.cleanup()


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.1,
    message: str = "condition",
    procs: list[Proc] | tuple[Proc, ...] = (),
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with the logs of ``procs``.

    Queries in the predicate run on the test's connection (autocommit: each sees the latest
    committed rows).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} (pid {p.pid}):\n{p.output()[-3000:]}" for p in procs)
            pytest.fail(f"timed out after {timeout}s waiting for {message}\n{logs}")
        time.sleep(interval)


# --- A server that holds requests ------------------------------------------------------------


@dataclass(frozen=True)
class HeldRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class HoldingServer:
    """Records every request on arrival, then holds it unanswered until ``release()``/``stop()``.

    Listens on 127.0.0.1 on a free port. ``netloc`` is the allowlist entry for it.
    """

    def __init__(self) -> None:
        self.received: list[HeldRequest] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        holder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with holder._lock:
                    holder.received.append(
                        HeldRequest(self.command, self.path, dict(self.headers.items()), body)
                    )
                holder._release.wait(120)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the client died while we held it

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.netloc}{path}"

    @property
    def requests(self) -> list[HeldRequest]:
        with self._lock:
            return list(self.received)

    def release(self) -> None:
        self._release.set()

    def start(self) -> HoldingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def holding_server() -> Iterator[HoldingServer]:
    server = HoldingServer().start()
    try:
        yield server
    finally:
        server.stop()
