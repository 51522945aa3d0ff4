"""The demo's webhook receiver (``playground.receiver``): it records each delivery once with the
headers Leasehold sends, answers the webhook status protocol and lists what it got, escaped."""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator

import pytest

from agentruns.tools import CheckContext
from playground import tools
from playground.receiver import DemoReceiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[DemoReceiver]:
    demo = DemoReceiver().start()
    yield demo
    demo.stop()


def request(receiver: DemoReceiver, method: str, path: str, body: bytes = b"", **headers: str):
    host, port = receiver.netloc.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read().decode()
    finally:
        connection.close()


def test_a_delivery_is_recorded_once_with_its_key_and_token(receiver) -> None:
    headers = {"Idempotency-Key": "run:call_0_0", "X-Fencing-Token": "3"}
    first = request(receiver, "POST", "/hooks/deployed", b'{"event": "deployed"}', **headers)
    again = request(receiver, "POST", "/hooks/deployed", b'{"event": "deployed"}', **headers)
    assert json.loads(first[2]) == {"received": True, "delivery": 1}
    assert json.loads(again[2]) == {"received": True, "delivery": 1, "repeat": True}
    [delivery] = receiver.deliveries.all()
    assert (delivery.path, delivery.idempotency_key, delivery.fencing_token) == (
        "/hooks/deployed",
        "run:call_0_0",
        "3",
    )
    assert delivery.body == '{"event": "deployed"}'


def test_it_answers_the_webhook_status_protocol(receiver, settings) -> None:
    request(receiver, "POST", "/h", b"{}", **{"Idempotency-Key": "k1"})
    assert json.loads(request(receiver, "GET", "/h?idempotency_key=k1")[2]) == {"landed": True}
    assert json.loads(request(receiver, "GET", "/h?idempotency_key=k2")[2]) == {"landed": False}
    # call_webhook's own check reads it: a delivery it got has landed.
    key = f"{uuid.UUID(int=1)}:call_0_0"
    request(receiver, "POST", "/h", b"{}", **{"Idempotency-Key": key})
    context = CheckContext(
        run_uuid=uuid.UUID(int=1),
        call_id="call_0_0",
        initiator_id=None,
        fencing_token=1,
        timeout_seconds=5,
        attempt=1,
    )
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [receiver.netloc]}
    answer = tools.check_call_webhook(context, {"url": receiver.url("/h")})
    assert answer.verdict == "landed"


def test_its_page_lists_the_deliveries_newest_first_escaped(receiver) -> None:
    status, content_type, page = request(receiver, "GET", "/")
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    assert 'id="none"' in page
    request(receiver, "POST", "/a", b"<script>alert(1)</script>", **{"Idempotency-Key": "<k>"})
    request(receiver, "POST", "/b", b"{}", **{"Idempotency-Key": "second"})
    page = request(receiver, "GET", "/")[2]
    assert "2 deliveries, newest first" in page
    assert page.index('data-key="second"') < page.index('data-key="&lt;k&gt;"')
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert request(receiver, "GET", "/nothing")[0] == 404
