"""``agentruns.outbound``: the webhook allowlist checks the name and the addresses it resolves to
(once per call), and the connection goes to a checked address — over HTTP and HTTPS, IPv4 and
IPv6 — while ``Host`` and TLS keep the name. Real local servers receive (or do not receive) every
request; only DNS answers are scripted (``tests/support/resolver.py``)."""

from __future__ import annotations

import http.client
import ipaddress
import json
import ssl
from collections.abc import Iterator

import pytest
import trustme

from agentruns.outbound import (
    WebhookRefused,
    address_problem,
    post_json,
    resolve_target,
    webhook_target,
)
from tests.support.http_recorder import HTTPRecorder, recorders_on_one_port
from tests.support.resolver import ScriptedDNS


def recorder(**options) -> HTTPRecorder:
    return HTTPRecorder(**options).start()


@pytest.fixture
def twin_servers() -> Iterator[list[HTTPRecorder]]:
    """Two real servers on one port: the intended one on 127.0.0.2, a "victim" on 127.0.0.1."""
    with recorders_on_one_port("127.0.0.2", "127.0.0.1") as servers:
        yield servers


# --- Which addresses are public --------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "a cloud metadata address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("192.0.0.192", "a cloud metadata address"),
        ("100.100.100.200", "a cloud metadata address"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("100.64.0.1", "not globally reachable"),
        ("240.0.0.1", "private"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("64:ff9b::a9fe:a9fe", "a cloud metadata address"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ],
)
def test_which_addresses_are_public(address: str, problem: str | None):
    assert address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize(
    ("url", "entries", "allowed"),
    [
        ("http://[::1]:8080/a", ["[0:0:0:0:0:0:0:1]:8080"], True),  # canonical IPv6
        ("http://[0::1]:8080/a", ["[::1]:8080"], True),
        ("http://127.0.0.1:8080/a", ["127.0.0.1"], False),  # a bare entry: port 80 only
        ("http://127.0.0.1/a", ["127.0.0.1"], True),
        ("http://hooks.example/a", ["hooks.example:99999", "[::1"], False),  # not entries
    ],
)
def test_entries_compare_ip_literals_canonically(url: str, entries: list[str], allowed: bool):
    if allowed:
        webhook_target(url, entries)
    else:
        with pytest.raises(WebhookRefused):
            webhook_target(url, entries)


# --- A name is judged by the addresses it resolves to -----------------------------------------


def test_a_name_resolving_to_loopback_is_refused_though_its_name_is_listed(
    http_recorder: HTTPRecorder,
):
    url = f"http://localhost:{http_recorder.port}/hook"
    with pytest.raises(WebhookRefused) as refused:
        post_json(url, {"a": 1}, allowlist=[f"localhost:{http_recorder.port}"], timeout=2)
    message = str(refused.value)
    assert message.startswith("host 'localhost' resolves only to addresses that are not public")
    assert "127.0.0.1 (loopback)" in message and message.endswith("not sent")
    assert http_recorder.requests == []


def test_a_listed_address_may_be_reached_by_name_and_the_host_header_keeps_the_name(
    http_recorder: HTTPRecorder,
):
    port = http_recorder.port
    allowlist = [f"localhost:{port}", f"127.0.0.1:{port}"]
    target = resolve_target(f"http://localhost:{port}/hook?x=1", allowlist)
    assert target.addresses == ("127.0.0.1",)  # ::1 (if localhost has it) is not listed
    answer = post_json(
        f"http://localhost:{port}/hook?x=1", {"a": 1}, allowlist=allowlist, timeout=2
    )
    assert answer.status == 200
    [received] = http_recorder.requests
    assert received.path == "/hook?x=1" and json.loads(received.body) == {"a": 1}
    assert received.headers["Host"] == f"localhost:{port}"
    # The address entry does not stand in for the name: the name must be listed too.
    with pytest.raises(WebhookRefused, match="not in AGENTRUNS"):
        resolve_target(f"http://localhost:{port}/", [f"127.0.0.1:{port}"])


def test_a_metadata_address_is_refused_unless_listed_as_an_address(scripted_dns: ScriptedDNS):
    scripted_dns.answer("metadata.test", ["169.254.169.254"])
    with pytest.raises(WebhookRefused, match=r"169\.254\.169\.254 \(a cloud metadata address\)"):
        post_json("http://metadata.test/latest/", {}, allowlist=["metadata.test"], timeout=1)
    # An operator who lists the address itself means it.
    listed = ["metadata.test", "169.254.169.254"]
    assert resolve_target("http://metadata.test/x", listed).addresses == ("169.254.169.254",)
    literal = resolve_target("http://169.254.169.254/x", ["169.254.169.254"])
    assert literal.addresses == ("169.254.169.254",) and literal.host == "169.254.169.254"


def test_a_name_with_public_and_private_answers_is_pinned_to_the_allowed_ones(
    scripted_dns: ScriptedDNS,
):
    scripted_dns.answer("mixed.test", ["10.0.0.7", "8.8.4.4", "127.0.0.1"])
    target = resolve_target("https://mixed.test/x", ["mixed.test"])
    assert target.addresses == ("8.8.4.4",)
    assert scripted_dns.lookups("mixed.test") == 1


def test_dns_rebinding_cannot_reach_the_address_answered_after_the_check(
    scripted_dns: ScriptedDNS, twin_servers: list[HTTPRecorder]
):
    """The name first resolves to an allowed address (127.0.0.2, listed: the public address of a
    real attack, kept on this machine), then to 127.0.0.1. The request goes to the address that
    was checked; the second answer is never asked for."""
    intended, victim = twin_servers
    port = intended.port
    allowlist = [f"hooks.rebind.test:{port}", f"127.0.0.2:{port}"]
    scripted_dns.answer("hooks.rebind.test", ["127.0.0.2"], ["127.0.0.1"])

    answer = post_json(
        f"http://hooks.rebind.test:{port}/hook", {"n": 1}, allowlist=allowlist, timeout=2
    )

    assert answer.status == 200
    [received] = intended.requests
    assert received.headers["Host"] == f"hooks.rebind.test:{port}"
    assert victim.requests == []
    assert scripted_dns.lookups("hooks.rebind.test") == 1
    # Without the pin, the connection's own lookup would have taken the rebound answer.
    unpinned = http.client.HTTPConnection("hooks.rebind.test", port, timeout=2)
    unpinned.request("GET", "/")
    unpinned.getresponse().read()
    unpinned.close()
    assert len(victim.requests) == 1


def test_ipv6_is_checked_and_pinned_too(scripted_dns: ScriptedDNS):
    server = recorder(host="::1")
    try:
        port = server.port
        scripted_dns.answer("v6.test", ["::1"])
        with pytest.raises(WebhookRefused, match=r"::1 \(loopback\)"):
            post_json(f"http://v6.test:{port}/", {}, allowlist=[f"v6.test:{port}"], timeout=2)
        allowlist = [f"v6.test:{port}", f"[::1]:{port}"]
        answer = post_json(f"http://v6.test:{port}/", {}, allowlist=allowlist, timeout=2)
        assert answer.status == 200
        [received] = server.requests
        assert received.headers["Host"] == f"v6.test:{port}"
        # An IPv6 literal, listed as itself.
        direct = post_json(server.url("/lit"), {}, allowlist=[server.netloc], timeout=2)
        assert direct.status == 200 and server.requests[-1].path == "/lit"
    finally:
        server.stop()


def test_https_is_pinned_with_the_name_as_sni_and_certificate(
    scripted_dns: ScriptedDNS, monkeypatch: pytest.MonkeyPatch, tmp_path
):
    """A real HTTPS server on 127.0.0.2 with a certificate for ``hooks.tls.test`` only: the
    client connects to the checked address, says the name in SNI and verifies the certificate
    against it (an address would not match)."""
    authority = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("hooks.tls.test").configure_cert(context)
    names: list[str | None] = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    ca_file = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the client trusts this authority
    server = recorder(host="127.0.0.2", tls=context)
    try:
        port = server.port
        scripted_dns.answer("hooks.tls.test", ["127.0.0.2"], ["127.0.0.1"])
        allowlist = [f"hooks.tls.test:{port}", f"127.0.0.2:{port}"]
        answer = post_json(
            f"https://hooks.tls.test:{port}/tls", {"s": 1}, allowlist=allowlist, timeout=5
        )
        assert answer.status == 200
        assert names == ["hooks.tls.test"]
        [received] = server.requests
        assert received.path == "/tls" and received.headers["Host"] == f"hooks.tls.test:{port}"
        assert scripted_dns.lookups("hooks.tls.test") == 1
        # Reached by its address, the certificate (for the name) does not match: refused.
        with pytest.raises(ssl.SSLCertVerificationError):
            post_json(server.url("/"), {}, allowlist=[server.netloc], timeout=5)
        assert len(server.requests) == 1
    finally:
        server.stop()


def test_a_name_that_does_not_resolve_sends_nothing(scripted_dns: ScriptedDNS):
    scripted_dns.answer("void.test")  # NXDOMAIN
    with pytest.raises(OSError) as failed:
        post_json("http://void.test/", {}, allowlist=["void.test"], timeout=1)
    assert not isinstance(failed.value, WebhookRefused)
