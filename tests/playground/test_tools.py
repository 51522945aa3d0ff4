"""The playground's sample tools, run through ``invoke_tool`` against the database."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from agentruns.models import Effect
from agentruns.tools import (
    CheckContext,
    ToolContext,
    invoke_tool,
    overlay_input,
    registry,
    validate_input,
)
from agentruns.tools.result_kinds import REFUSED_PREFIX
from playground import tools
from playground.models import Note
from tests.support.http_recorder import HTTPRecorder, recorders_on_one_port
from tests.support.resolver import ScriptedDNS

pytestmark = pytest.mark.django_db


def context(timeout: float = 2.0, call_id: str = "call-7") -> ToolContext:
    return ToolContext(
        run_uuid=uuid.UUID("00000000-0000-0000-0000-0000000000aa"),
        call_id=call_id,
        initiator_id=None,
        fencing_token=5,
        timeout_seconds=timeout,
    )


def call(name: str, arguments: Any, timeout: float = 2.0, call_id: str = "call-7") -> Any:
    return invoke_tool(registry.get(name), arguments, context(timeout, call_id))


def allowlist(*entries: str) -> override_settings:
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": list(entries)})


def test_effects_and_schemas_are_declared() -> None:
    expected = {
        "list_notes": Effect.READ,
        "read_note": Effect.READ,
        "update_note": Effect.IDEMPOTENT_WRITE,
        "create_note": Effect.NON_IDEMPOTENT_WRITE,
        "call_webhook": Effect.NON_IDEMPOTENT_WRITE,
        "wait": Effect.READ,
        "ask_human": Effect.READ,
    }
    for name, effect in expected.items():
        defined = registry.get(name)
        assert defined is not None and defined.effect == effect, name
        assert defined.parameters["additionalProperties"] is False
        assert defined.description
    assert [t.name for t in registry.all() if t.input_schema is not None] == ["ask_human"]


# --- notes ------------------------------------------------------------------------------------


def test_list_and_read_notes() -> None:
    first = Note.objects.create(title="one", body="first body")
    Note.objects.create(title="two")
    listed = call("list_notes", {})
    assert listed.ok
    assert listed.content == {
        "notes": [{"id": first.pk, "title": "one"}, {"id": first.pk + 1, "title": "two"}],
        "truncated": False,
    }
    read = call("read_note", {"id": first.pk})
    assert read.ok
    assert (read.content["title"], read.content["body"]) == ("one", "first body")


def test_read_missing_note_is_an_error_result() -> None:
    result = call("read_note", {"id": 999})
    assert result.ok is False
    assert result.error == "NoteNotFound: note 999 does not exist"


def test_create_note_creates_one_per_call() -> None:
    for call_id in ("call-1", "call-2"):
        result = call("create_note", {"title": "t", "body": "b"}, call_id=call_id)
        assert result.ok
    assert list(Note.objects.values_list("title", "body")) == [("t", "b"), ("t", "b")]
    assert result.content["id"] == Note.objects.last().pk


def test_create_note_stamps_its_key_and_one_key_never_makes_two_notes() -> None:
    assert call("create_note", {"title": "t", "body": "b"}).ok
    again = call("create_note", {"title": "t", "body": "b"})  # the same call id: the same key
    assert again.ok is False and again.error.startswith("DuplicateCall: a note with the")
    [note] = Note.objects.all()
    assert note.idempotency_key == context().idempotency_key


def test_create_note_refuses_bad_arguments_without_writing() -> None:
    result = call("create_note", {"title": "t"})
    assert result.ok is False and "'body' is a required property" in result.error
    assert Note.objects.count() == 0


def test_update_note_sets_only_the_given_fields_and_converges() -> None:
    note = Note.objects.create(title="old", body="keep")
    for _ in range(2):
        result = call("update_note", {"id": note.pk, "title": "new"})
        assert result.ok
        assert (result.content["title"], result.content["body"]) == ("new", "keep")
    note.refresh_from_db()
    assert (note.title, note.body) == ("new", "keep")
    assert call("update_note", {"id": note.pk, "body": ""}).ok
    note.refresh_from_db()
    assert (note.title, note.body) == ("new", "")


def test_update_missing_note_is_an_error_result() -> None:
    result = call("update_note", {"id": 12345, "title": "x"})
    assert result.ok is False
    assert result.error == "NoteNotFound: note 12345 does not exist"
    assert Note.objects.count() == 0


def test_update_note_without_fields_is_an_error_result() -> None:
    note = Note.objects.create(title="t")
    result = call("update_note", {"id": note.pk})
    assert result.ok is False and "title, body or both" in result.error


# --- call_webhook -----------------------------------------------------------------------------


def test_webhook_to_a_host_not_allowlisted_sends_nothing(
    http_recorder: HTTPRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    with allowlist("example.com", f"127.0.0.1:{http_recorder.port + 1}"):
        result = call("call_webhook", {"url": http_recorder.url("/hook"), "payload": {"a": 1}})
    assert result.ok is False and result.refused is True
    assert result.error.startswith(REFUSED_PREFIX)
    assert http_recorder.netloc in result.error
    assert http_recorder.requests == []
    # An expected refusal: one warning line, no traceback.
    [logged] = [r for r in caplog.records if r.name == "agentruns.tools.invocation"]
    assert logged.levelname == "WARNING" and logged.exc_info is None
    assert "refused the call" in logged.getMessage() and "\n" not in logged.getMessage()


def test_webhook_with_an_empty_allowlist_sends_nothing(http_recorder: HTTPRecorder) -> None:
    with allowlist():
        result = call("call_webhook", {"url": http_recorder.url(), "payload": {}})
    assert result.ok is False
    assert http_recorder.requests == []


def test_webhook_to_an_allowlisted_host_posts_once(http_recorder: HTTPRecorder) -> None:
    with allowlist(http_recorder.netloc):
        result = call(
            "call_webhook", {"url": http_recorder.url("/hook?x=1"), "payload": {"a": [1, "é"]}}
        )
    assert result.ok, result.error
    assert result.content == {"status": 200, "body": '{"received": true}', "truncated": False}
    [received] = http_recorder.requests
    assert (received.method, received.path) == ("POST", "/hook?x=1")
    assert json.loads(received.body) == {"a": [1, "é"]}
    headers = {k.lower(): v for k, v in received.headers.items()}
    assert headers["idempotency-key"] == "00000000-0000-0000-0000-0000000000aa:call-7"
    assert headers["x-fencing-token"] == "5"
    assert headers["content-type"] == "application/json"


def test_webhook_returns_error_statuses_and_truncates_bodies(
    http_recorder: HTTPRecorder,
) -> None:
    http_recorder.respond_with(500, b"x" * 5000)
    with allowlist(http_recorder.netloc):
        result = call("call_webhook", {"url": http_recorder.url(), "payload": {}})
    assert result.ok
    assert result.content["status"] == 500
    assert result.content["body"] == "x" * tools.WEBHOOK_BODY_CHARS
    assert result.content["truncated"] is True
    assert len(http_recorder.requests) == 1


def test_webhook_does_not_follow_redirects(http_recorder: HTTPRecorder) -> None:
    target = HTTPRecorder().start()
    try:
        http_recorder.respond_with(307, b"", {"Location": target.url("/stolen")})
        with allowlist(http_recorder.netloc, target.netloc):
            result = call("call_webhook", {"url": http_recorder.url(), "payload": {"s": 1}})
        assert result.ok
        assert result.content["status"] == 307
        assert len(http_recorder.requests) == 1
        assert target.requests == []
    finally:
        target.stop()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://{netloc}/x",
        "file:///etc/passwd",
        "//{netloc}/x",
        "{netloc}/x",
        "http://user:pw@{netloc}/x",
        "http://{netloc}@evil.example/x",
        "http://evil.example#@{netloc}/x",
        "http://evil.example\\@{netloc}/x",
        "http:///x",
        "http://{netloc}:99999/x",
        "http://127.0.0.1/x",
        "http://127.0.0.2:{port}/x",
        "http:// {netloc}/x",
    ],
)
def test_webhook_refuses_tricky_urls_without_sending(url: str, http_recorder: HTTPRecorder) -> None:
    url = url.format(netloc=http_recorder.netloc, port=http_recorder.port)
    with allowlist(http_recorder.netloc):
        result = call("call_webhook", {"url": url, "payload": {}})
    assert result.ok is False
    assert http_recorder.requests == []


@pytest.mark.parametrize(
    ("url", "entries", "allowed"),
    [
        ("https://hooks.example.com/a", ["hooks.example.com"], True),
        ("https://HOOKS.example.com:443/a", ["hooks.example.com"], True),
        ("https://hooks.example.com:8443/a", ["hooks.example.com"], False),
        ("https://hooks.example.com:8443/a", ["hooks.example.com:8443"], True),
        ("http://hooks.example.com/a", ["hooks.example.com:80"], True),
        ("http://[::1]:8080/a", ["[::1]:8080"], True),
        ("http://[::1]:8080/a", ["::1"], False),
        ("https://hooks.example.com.evil.io/a", ["hooks.example.com"], False),
        ("https://evil.io/hooks.example.com", ["hooks.example.com"], False),
    ],
)
def test_webhook_allowlist_matching(url: str, entries: list[str], allowed: bool) -> None:
    if allowed:
        tools.webhook_target(url, entries)
    else:
        with pytest.raises(tools.WebhookRefused):
            tools.webhook_target(url, entries)


def test_webhook_to_a_name_resolving_to_loopback_is_refused_though_the_name_is_listed(
    http_recorder: HTTPRecorder,
) -> None:
    url = f"http://localhost:{http_recorder.port}/hook"
    with allowlist(f"localhost:{http_recorder.port}"):
        result = call("call_webhook", {"url": url, "payload": {}})
        preview = tools.preview_call_webhook(context(), {"url": url, "payload": {}})
    assert result.ok is False and result.in_doubt is False and result.refused is True
    assert result.error.startswith(
        REFUSED_PREFIX + "host 'localhost' resolves only to addresses that are not public: "
    )
    assert "127.0.0.1 (loopback)" in result.error
    assert http_recorder.requests == []
    # The preview checks the name only (no lookup while a turn waits): the call decides.
    assert preview.summary.startswith("POST 2 bytes of JSON to localhost:")


def test_webhook_to_a_name_whose_address_is_listed_posts_to_that_address(
    http_recorder: HTTPRecorder,
) -> None:
    url = f"http://localhost:{http_recorder.port}/hook"
    with allowlist(f"localhost:{http_recorder.port}", http_recorder.netloc):
        result = call("call_webhook", {"url": url, "payload": {"a": 1}})
    assert result.ok, result.error
    [received] = http_recorder.requests
    assert received.headers["Host"] == f"localhost:{http_recorder.port}"
    assert received.headers["Idempotency-Key"] == "00000000-0000-0000-0000-0000000000aa:call-7"


def test_webhook_dns_rebinding_cannot_reach_the_private_address(
    scripted_dns: ScriptedDNS,
) -> None:
    """The name resolves to an allowed address (127.0.0.2, listed as an address: what a public
    answer is in a real attack) when checked, and to 127.0.0.1 afterwards. The POST, and the
    status protocol's GET of a later check, go to the checked address; 127.0.0.1 sees nothing."""
    with recorders_on_one_port("127.0.0.2", "127.0.0.1") as (intended, victim):
        port = intended.port
        url = f"http://hooks.rebind.test:{port}/hook"
        with allowlist(f"hooks.rebind.test:{port}", f"127.0.0.2:{port}"):
            scripted_dns.answer("hooks.rebind.test", ["127.0.0.2"], ["127.0.0.1"])
            result = call("call_webhook", {"url": url, "payload": {"n": 1}})
            assert result.ok, result.error
            assert scripted_dns.lookups("hooks.rebind.test") == 1
            [posted] = intended.requests
            assert posted.method == "POST" and posted.headers["Host"] == f"hooks.rebind.test:{port}"

            # A later call resolves afresh: now the name answers 127.0.0.1, which is refused.
            again = call("call_webhook", {"url": url, "payload": {"n": 2}})
            assert again.ok is False and "127.0.0.1 (loopback)" in again.error
            check = tools.check_call_webhook(
                CheckContext(**vars(context()), name="call_webhook", arguments={"url": url}),
                {"url": url},
            )
            assert check.verdict == "unknown" and "not asked" in check.evidence
        assert victim.requests == []
        assert len(intended.requests) == 1


# --- wait and ask_human -----------------------------------------------------------------------


def test_wait_is_capped_by_the_timeout() -> None:
    result = call("wait", {"seconds": 30}, timeout=0.05)
    assert result.ok
    assert result.content == {"waited_seconds": 0.05, "requested_seconds": 30.0}


def test_wait_shorter_than_the_timeout() -> None:
    result = call("wait", {"seconds": 0.01}, timeout=5)
    assert result.content["waited_seconds"] == 0.01


def test_wait_refuses_negative_seconds() -> None:
    assert call("wait", {"seconds": -1}).ok is False


def test_ask_human_returns_the_overlaid_values() -> None:
    ask = registry.get("ask_human")
    assert validate_input(ask, {"answer": "yes", "priority": 2}) == []
    assert validate_input(ask, {"priority": 2}) != []
    merged = overlay_input(ask, {"question": "Ship it?"}, {"answer": "yes", "priority": 2})
    result = invoke_tool(ask, merged, context())
    assert result.content == {"question": "Ship it?", "answer": "yes", "priority": 2}


def test_ask_human_priority_is_optional_and_answer_is_not() -> None:
    assert call("ask_human", {"question": "q", "answer": "a"}).content == {
        "question": "q",
        "answer": "a",
        "priority": None,
    }
    unanswered = call("ask_human", {"question": "q"})
    assert unanswered.ok is False and "no answer" in unanswered.error
