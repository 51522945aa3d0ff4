"""A real local SMTP server (aiosmtpd) that keeps every message it receives, for tests.

``smtp_server`` starts one on 127.0.0.1 on a free port in aiosmtpd's own thread; ``messages``
are the parsed ``email.message.EmailMessage`` objects received, with the envelope's recipients.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller


@dataclass(frozen=True)
class Received:
    envelope_from: str
    envelope_to: list[str]
    message: EmailMessage


class _Handler:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.original_content, policy=policy.default)
        with self.lock:
            self.received.append(
                Received(envelope.mail_from, list(envelope.rcpt_tos), message)  # type: ignore[arg-type]
            )
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SMTPServer:
    def __init__(self) -> None:
        self._handler = _Handler()
        self.port = free_port()
        self._controller = Controller(self._handler, hostname="127.0.0.1", port=self.port)

    @property
    def messages(self) -> list[Received]:
        with self._handler.lock:
            return list(self._handler.received)

    def settings(self) -> dict[str, Any]:
        """The Django settings that send mail to this server."""
        return {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": self.port,
            "EMAIL_USE_TLS": False,
            "EMAIL_TIMEOUT": 5,
        }

    def start(self) -> SMTPServer:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()


@pytest.fixture
def smtp_server() -> Iterator[SMTPServer]:
    server = SMTPServer().start()
    try:
        yield server
    finally:
        server.stop()
