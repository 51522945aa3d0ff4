"""The demo's webhook receiver: a small HTTP server that ``scripts/serve`` runs beside Leasehold
(``manage.py demo_receiver``) and allowlists, so the *Webhook sender* demo delivers somewhere
real and shows what arrived.

``POST <any path>`` records a delivery — path, ``Idempotency-Key``, ``X-Fencing-Token``, the
start of the body — and answers ``200 {"received": true, "delivery": n}``; a key it has seen
answers ``{"received": true, "delivery": n, "repeat": true}`` and is not recorded twice.
``GET <any path>?idempotency_key=K`` is the webhook status protocol (README): ``200
{"landed": true|false}``. ``GET /`` is the page listing the deliveries, newest first.

Deliveries live in memory (the last ``MAX_DELIVERIES``): a demo, not a store. Everything a
sender chose is escaped on the page. Never part of the Django site: it listens on its own port,
and nothing in Leasehold imports it.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_DELIVERIES = 200
BODY_CHARS = 2000
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Delivery:
    number: int
    received_at: datetime
    path: str
    idempotency_key: str
    fencing_token: str
    body: str


class Deliveries:
    """What the receiver got, oldest first, thread-safe; ``on_delivery`` is told of each new
    one (outside the lock)."""

    def __init__(self, on_delivery: Callable[[Delivery], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._items: list[Delivery] = []
        self._count = 0
        self._on_delivery = on_delivery

    def add(self, *, path: str, key: str, token: str, body: str) -> tuple[Delivery, bool]:
        """Record a delivery unless one with the same non-empty key is recorded: that one, and
        whether it was a repeat."""
        with self._lock:
            seen = next((d for d in self._items if key and d.idempotency_key == key), None)
            if seen is not None:
                return seen, True
            self._count += 1
            delivery = Delivery(self._count, datetime.now(UTC), path, key, token, body)
            self._items.append(delivery)
            del self._items[:-MAX_DELIVERIES]
        if self._on_delivery is not None:
            self._on_delivery(delivery)
        return delivery, False

    def landed(self, key: str) -> bool:
        with self._lock:
            return any(d.idempotency_key == key for d in self._items)

    def all(self) -> list[Delivery]:
        with self._lock:
            return list(self._items)


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Webhook deliveries · Leasehold demo receiver</title>
<style>
  body {{ font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px; padding: 1rem;
         color: #222; background: #fff; }}
  table {{ border-collapse: collapse; width: 100%; }}
  th, td {{ padding: .3rem .5rem; border-bottom: 1px solid #ddd; text-align: left;
            vertical-align: top; }}
  code, pre {{ overflow-wrap: anywhere; white-space: pre-wrap; margin: 0; }}
  .meta {{ color: #555; }}
  @media (max-width: 600px) {{
    thead {{ position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }}
    table, tbody, tr, td {{ display: block; }}
    tr {{ border-bottom: 1px solid #ddd; padding: .4rem 0; }} td {{ border: 0; padding: .1rem 0; }}
    td[data-label]::before {{ content: attr(data-label) ": "; font-weight: 600; }}
  }}
</style>
</head>
<body>
<main>
<h1>Webhook deliveries</h1>
<p class="meta">The Leasehold demo's receiver (<code>manage.py demo_receiver</code>): every POST
it got, newest first, with the <code>Idempotency-Key</code> and <code>X-Fencing-Token</code>
headers Leasehold sent. Kept in memory; reload the page for new ones. Times in UTC.</p>
{body}
</main>
</body>
</html>
"""

ROW = (
    '<tr data-key="{key}"><td data-label="#">{number}</td>'
    '<td data-label="Received"><time datetime="{iso}">{when}</time></td>'
    '<td data-label="Path"><code>{path}</code></td>'
    '<td data-label="Idempotency-Key"><code>{key}</code></td>'
    '<td data-label="Fencing token"><code>{token}</code></td>'
    '<td data-label="Body"><pre>{body}</pre></td></tr>'
)


def render_page(deliveries: list[Delivery]) -> str:
    """The HTML page listing ``deliveries`` newest first, every value escaped."""
    if not deliveries:
        return PAGE.format(body='<p id="none">No deliveries yet.</p>')
    rows = "".join(
        ROW.format(
            number=d.number,
            iso=d.received_at.isoformat(timespec="seconds"),
            when=d.received_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
            path=html.escape(d.path),
            key=html.escape(d.idempotency_key or "(none)"),
            token=html.escape(d.fencing_token or "(none)"),
            body=html.escape(d.body),
        )
        for d in reversed(deliveries)
    )
    table = (
        f'<table id="deliveries"><caption>{len(deliveries)} '
        f"deliver{'y' if len(deliveries) == 1 else 'ies'}, newest first</caption>"
        '<thead><tr><th scope="col">#</th><th scope="col">Received</th><th scope="col">Path</th>'
        '<th scope="col">Idempotency-Key</th><th scope="col">Fencing token</th>'
        f'<th scope="col">Body</th></tr></thead><tbody>{rows}</tbody></table>'
    )
    return PAGE.format(body=table)


class _Handler(BaseHTTPRequestHandler):
    deliveries: Deliveries  # set on the subclass each server makes
    server_version = "LeaseholdDemoReceiver"

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: object) -> None:
        self._answer(status, json.dumps(value).encode(), "application/json")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._json(413, {"received": False, "error": "body too large"})
            return
        raw = self.rfile.read(length) if length > 0 else b""
        delivery, repeat = self.deliveries.add(
            path=urlsplit(self.path).path,
            key=self.headers.get("Idempotency-Key", ""),
            token=self.headers.get("X-Fencing-Token", ""),
            body=raw.decode("utf-8", errors="replace")[:BODY_CHARS],
        )
        answer: dict[str, object] = {"received": True, "delivery": delivery.number}
        if repeat:
            answer["repeat"] = True
        self._json(200, answer)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        key = (parse_qs(parts.query).get("idempotency_key") or [""])[0]
        key = key or self.headers.get("Idempotency-Key", "")
        if key:
            self._json(200, {"landed": self.deliveries.landed(key)})
        elif parts.path == "/":
            page = render_page(self.deliveries.all()).encode()
            self._answer(200, page, "text/html; charset=utf-8")
        elif parts.path == "/deliveries.json":
            items = [
                {
                    "number": d.number,
                    "received_at": d.received_at.isoformat(),
                    "path": d.path,
                    "idempotency_key": d.idempotency_key,
                    "fencing_token": d.fencing_token,
                    "body": d.body,
                }
                for d in self.deliveries.all()
            ]
            self._json(200, items)
        else:
            self._answer(404, b"not found", "text/plain; charset=utf-8")

    def log_message(self, format: str, *args: object) -> None:
        return  # the command prints one line per delivery itself (``on_delivery``)


class DemoReceiver:
    """The receiver on ``host:port`` (port 0: a free one): ``start`` serves it from a daemon
    thread, ``serve_forever`` from the caller's."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        on_delivery: Callable[[Delivery], None] | None = None,
    ) -> None:
        self.deliveries = Deliveries(on_delivery)
        handler = type("Handler", (_Handler,), {"deliveries": self.deliveries})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def netloc(self) -> str:
        """``host:port``: its entry in ``AGENTRUNS_WEBHOOK_ALLOWLIST``."""
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def url(self, path: str = "/") -> str:
        return f"http://{self.netloc}{path}"

    def start(self) -> DemoReceiver:
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
