"""Servers a test owns and may restart: a PostgreSQL cluster and a Redis server of its own.

Never restart the shared PostgreSQL (5432) or Redis (6379): other tests run on them. These start
private ones on free ports, in temporary directories, and remove them afterwards.

``PrivatePostgres`` is a cluster made by ``initdb`` in a temporary directory (trust
authentication, listening on 127.0.0.1 and a socket in that directory). PostgreSQL refuses to
run as root, so as root (CI) every ``initdb``/``pg_ctl`` runs as the ``postgres`` user through
``runuser``; otherwise as the current user. ``restart(mode)`` is ``pg_ctl stop -m <mode>``
(``fast``: backends terminated, a checkpoint; ``immediate``: the postmaster and every backend
killed, crash recovery at the next start), an optional outage, then ``start``.

``PrivateRedis`` is a ``redis-server`` subprocess that keeps nothing on disk (``--save ""``,
``--appendonly no``): a restart loses every queued task, as a broker without persistence does.

Without the binaries the fixtures skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _postgres_bin() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest version."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    return versions[0].parent if versions else None


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (see the module docstring)."""

    USER = "leasehold"
    DATABASE = "leasehold_chaos"

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        self.directory = Path(tempfile.mkdtemp(prefix="leasehold-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.restarts: list[tuple[str, float]] = []  # (mode, seconds the server was down)
        self._options = ""  # the server's command-line options (``create``)
        if self.as_postgres:
            shutil.chown(self.directory, user="postgres", group="postgres")

    @property
    def url(self) -> str:
        return f"postgres://{self.USER}@127.0.0.1:{self.port}/{self.DATABASE}"

    def _run(self, *args: str, timeout: float = 120) -> str:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=self.directory
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def create(self) -> PrivatePostgres:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.directory}",
                # The data survives a killed postmaster (the OS keeps the page cache); only
                # a machine crash would need fsync. Spares the shared machine's disk.
                "-c fsync=off",
                "-c max_connections=60",
            ]
        )
        self.start()
        self._run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.USER, self.DATABASE
        )
        return self

    def start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            self._options,
            "-w",
            "-t",
            "120",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")

    def restart(self, mode: str, *, down_for: float = 0.0) -> float:
        """Stop with ``mode`` (``fast`` or ``immediate``), stay down ``down_for`` seconds, start
        again; returns how long the server refused connections (about)."""
        began = time.monotonic()
        self.stop(mode)
        time.sleep(down_for)
        self.start()
        outage = time.monotonic() - began
        self.restarts.append((mode, outage))
        return outage

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the session's own, with an empty database ``leasehold_chaos``."""
    bindir = _postgres_bin()
    if bindir is None or (os.geteuid() == 0 and not shutil.which("runuser")):
        missing("needs PostgreSQL's initdb and pg_ctl (and runuser as root)")
    server = PrivatePostgres(bindir)  # type: ignore[arg-type]
    try:
        server.create()
    except Exception as exc:
        server.destroy()
        missing(f"could not start a private PostgreSQL cluster: {exc}")
    try:
        yield server
    finally:
        server.destroy()


class PrivateRedis:
    """A ``redis-server`` of the test's own, keeping nothing on disk."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="leasehold-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts: list[float] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        log = (self.directory / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the private redis-server did not start") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        """SIGKILL: whatever the server held in memory is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self, *, down_for: float = 0.0) -> float:
        began = time.monotonic()
        self.stop()
        time.sleep(down_for)
        self.start()
        outage = time.monotonic() - began
        self.restarts.append(outage)
        return outage

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        missing("needs redis-server")
    server = PrivateRedis(binary)  # type: ignore[arg-type]
    try:
        server.start()
        yield server
    finally:
        server.destroy()
