"""Tokens in headless Chromium: the answer fills in as the model writes it, as text (markup the
model wrote is never interpreted), and the recorded answer takes its place.

Needs Debian's ``/usr/bin/chromium`` and Playwright's Python package (as the other browser
tests)."""

from __future__ import annotations

import pytest

from agentruns.models import AgentConfiguration, AgentRun, Provider, Status
from tests.playground.conftest import join_streams
from tests.support.browser import new_page
from tests.support.chat_server import ChatServer, completion
from tests.support.sse import chat_frames

pytestmark = pytest.mark.browser

KEY_ENV = "LEASEHOLD_TEST_BROWSER_STREAM_KEY"
HOSTILE = 'Here: <b id="bold">bold</b><img src=x onerror="window.pwned=1"> and the end.'


@pytest.fixture
def page(browser, live_server, developer, client):
    client.force_login(developer)
    page = new_page(browser)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    yield page
    join_streams()


def test_the_answer_fills_in_as_text_and_the_recorded_answer_replaces_it(
    page, live_server, chat_server: ChatServer, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, "sk-browser-stream-0123456789")
    AgentConfiguration.objects.create(
        slug="streamed",
        name="Streamed",
        provider=Provider.OPENAI,
        model="test-model",
        base_url=chat_server.base_url,
        api_key_env=KEY_ENV,
        timeout_seconds=30,
        tools=["list_notes"],
    )
    frames = chat_frames(completion(content=HOSTILE), {"stream_options": {"include_usage": True}})
    chat_server.stream_raw(frames, delay=0.15)

    page.goto(f"{live_server.url}/playground/?configuration=streamed")
    page.fill("textarea[name=prompt]", "Say something")
    page.click("#run-streamed")

    live = page.wait_for_selector("#trace .step-live .live-text:not(:empty)")
    partial = live.inner_text()
    assert partial and HOSTILE.startswith(partial) and partial != HOSTILE
    assert page.locator("#outcome [data-outcome]").count() == 0  # still writing
    assert page.locator("#trace [data-kind=llm]").count() == 0  # nothing recorded yet
    assert "Model answer, as it is written" in page.inner_text("#trace .step-live")
    page.wait_for_function("document.querySelector('#trace .live-text').textContent.includes('<b')")
    assert page.locator("#bold").count() == 0  # the model's markup shows as text

    page.wait_for_selector("#outcome [data-outcome=completed]")
    assert AgentRun.objects.get().status == Status.COMPLETED
    assert page.locator("#trace .step-live").count() == 0  # the recorded answer took its place
    assert page.locator("#trace [data-kind=llm]").count() == 1
    assert HOSTILE in page.inner_text("#trace [data-kind=llm]")
    assert page.locator("#bold, #trace img").count() == 0  # never interpreted as HTML
    assert page.evaluate("window.pwned === undefined")
