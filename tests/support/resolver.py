"""A scripted DNS at the socket boundary: ``socket.getaddrinfo`` answers chosen names from a script
and passes every other name (and every IP literal) to the real resolver.

DNS is the machine's edge: a test cannot make a real name resolve to 127.0.0.2 now and to
127.0.0.1 a moment later, so the ``scripted_dns`` fixture does that, and only that — the
connections that follow are real, to real local servers.

``scripted_dns.answer("hooks.test", ["127.0.0.2"], ["127.0.0.1"])``: the first lookup of
``hooks.test`` answers 127.0.0.2, every later one 127.0.0.1; ``answer("void.test")`` makes the
name unknown (``socket.gaierror``). ``lookups("hooks.test")`` counts the lookups of that name.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest


class ScriptedDNS:
    def __init__(self) -> None:
        self._real = socket.getaddrinfo
        self._answers: dict[str, list[list[str]]] = {}
        self._lookups: dict[str, int] = {}
        self._lock = threading.Lock()

    def answer(self, name: str, *answers: list[str]) -> None:
        """Answer lookups of ``name`` with ``answers`` in turn; the last one repeats."""
        with self._lock:
            self._answers[name.lower()] = [list(a) for a in answers]
            self._lookups[name.lower()] = 0

    def lookups(self, name: str) -> int:
        with self._lock:
            return self._lookups.get(name.lower(), 0)

    def getaddrinfo(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[tuple[Any, ...]]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        with self._lock:
            script = self._answers.get(name.lower())
            if script is not None:
                index = self._lookups[name.lower()]
                self._lookups[name.lower()] = index + 1
                addresses = script[min(index, len(script) - 1)] if script else []
        if script is None:
            return self._real(host, port, family, type, proto, flags)
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        found = []
        for address in addresses:
            if ":" in address:
                found.append(
                    (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, int(port or 0), 0, 0))
                )
            else:
                found.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0))))
        return found


@pytest.fixture
def scripted_dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedDNS]:
    dns = ScriptedDNS()
    monkeypatch.setattr(socket, "getaddrinfo", dns.getaddrinfo)
    yield dns
