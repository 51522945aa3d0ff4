"""A streamed playground run in headless Chromium: steps appear while the run is still going.

Needs Debian's ``/usr/bin/chromium`` (``.ci/run`` installs it) and Playwright's Python package.
"""

from __future__ import annotations

import pytest

from agentruns.models import AgentRun, Status
from playground.models import Note
from tests.agentruns.api_support import config
from tests.playground.conftest import join_streams
from tests.support.browser import new_page

pytestmark = pytest.mark.browser


@pytest.fixture
def page(browser, live_server, developer, client):
    """A page logged in as the developer (JavaScript on: the playground streams with it)."""
    client.force_login(developer)
    page = new_page(browser)
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    yield page
    join_streams()


def test_a_streamed_run_shows_steps_before_it_ends(page, live_server):
    config(
        "browser-notes",
        [
            {
                "tool_calls": [
                    {"name": "create_note", "arguments": {"title": "<b>t</b>", "body": ""}}
                ]
            },
            {"content": "Created <i>it</i>.", "delay": 1.5},
        ],
    )
    page.goto(f"{live_server.url}/playground/")
    page.select_option("select[name=configuration]", "browser-notes")
    page.fill("textarea[name=prompt]", "Make a note")
    page.click("#run-streamed")

    # The first pass suspends for approval: the pending turn appears, with Approve / Deny.
    page.wait_for_selector("#outcome [data-outcome=awaiting_approval]")
    assert page.locator("#trace [data-kind=request]").count() == 1
    assert page.locator("#trace [data-kind=llm]").count() == 1
    run = AgentRun.objects.get()
    assert run.status == Status.WAITING_FOR_APPROVAL
    assert page.get_attribute("#run-link", "href") == f"/playground/runs/{run.uuid}/"

    # Approve, streamed: the tool's step arrives while the model's slow answer is pending.
    page.click("#outcome button.approve")
    page.wait_for_selector("#trace [data-kind=tool]")
    assert page.locator("#outcome [data-outcome]").count() == 0  # the run has not ended
    assert AgentRun.objects.get(pk=run.pk).status == Status.RUNNING
    assert Note.objects.count() == 1

    page.wait_for_selector("#outcome [data-outcome=completed]")
    assert page.locator("#trace [data-kind=llm]").count() == 2
    assert "Created <i>it</i>." in page.inner_text("#outcome .output")  # shown as text
    assert page.locator("#trace b, #outcome i").count() == 0  # never interpreted as HTML
    assert page.inner_text("#stream-status") == "finished: completed"
