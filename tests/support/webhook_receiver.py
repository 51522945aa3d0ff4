"""A real local webhook receiver that implements (or refuses) the check protocol of
``call_webhook`` (README, "The webhook status protocol").

``POST`` records the delivery under its ``Idempotency-Key`` and answers 200 after
``post_delay`` seconds (longer than the tool timeout: the sender cannot tell whether it landed).
``GET ?idempotency_key=K`` answers ``200 {"landed": true|false}`` — whether a delivery with that
key was received — or, with ``get_status`` set, that status and no JSON. Listens on 127.0.0.1 on a
free port; ``netloc`` is its allowlist entry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest


@dataclass(frozen=True)
class Delivery:
    key: str
    fencing_token: str
    body: bytes


class WebhookReceiver:
    def __init__(self, *, post_delay: float = 0.0, get_status: int | None = None) -> None:
        self.post_delay = post_delay
        self.get_status = get_status
        self.deliveries: list[Delivery] = []
        self.questions: list[tuple[str, str, str]] = []  # (header key, query key, fencing token)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the sender gave up waiting

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(
                            self.headers.get("Idempotency-Key", ""),
                            self.headers.get("X-Fencing-Token", ""),
                            body,
                        )
                    )
                time.sleep(receiver.post_delay)
                self._answer(200, b'{"received": true}')

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                key = self.headers.get("Idempotency-Key", "")
                with receiver._lock:
                    receiver.questions.append(
                        (
                            key,
                            (query.get("idempotency_key") or [""])[0],
                            self.headers.get("X-Fencing-Token", ""),
                        )
                    )
                    landed = any(d.key == key for d in receiver.deliveries)
                if receiver.get_status is not None:
                    self._answer(receiver.get_status, b"internal error")
                    return
                self._answer(200, json.dumps({"landed": landed}).encode())

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

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(post_delay=1.5).start()
    try:
        yield receiver
    finally:
        receiver.stop()
