"""``manage.py demo_receiver [--host H] [--port P]``: the demo's webhook receiver
(``playground.receiver``), in the foreground until interrupted. ``scripts/serve`` runs it and
puts ``host:port`` in ``AGENTRUNS_WEBHOOK_ALLOWLIST``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentruns.management.commands.reap_stale_runs import positive_int
from playground.receiver import Delivery, DemoReceiver


class Command(BaseCommand):
    help = (
        "Run the demo's webhook receiver: it records every POST (path, Idempotency-Key, "
        "X-Fencing-Token, body), answers the webhook status protocol and lists the deliveries "
        "at its / page. In memory only; for the local demo, never for production."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="Address to listen on.")
        parser.add_argument(
            "--port", type=positive_int, default=8001, help="Port to listen on (default 8001)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def told(delivery: Delivery) -> None:
            self.stdout.write(
                f"delivery {delivery.number}: POST {delivery.path} "
                f"Idempotency-Key={delivery.idempotency_key or '-'} "
                f"X-Fencing-Token={delivery.fencing_token or '-'}"
            )
            self.stdout.flush()

        receiver = DemoReceiver(options["host"], options["port"], on_delivery=told)
        self.stdout.write(
            f"demo webhook receiver on {receiver.url()} (allowlist entry {receiver.netloc})"
        )
        self.stdout.flush()
        try:
            receiver.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            receiver.stop()
