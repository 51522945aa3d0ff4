"""A streamed playground run in headless Chromium: steps appear while the run is still going.

Needs Debian's ``/usr/bin/chromium`` (``.ci/run`` installs it) and Playwright's Python package.
"""

from __future__ import annotations

import pytest
from django.conf import settings

from agentruns.models import AgentRun, Status
from playground.models import Note
from tests.agentruns.support.api import config
from tests.playground.conftest import join_streams
from tests.support.axe import assert_accessible
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
    assert page.inner_text("#stream-status") == "Run finished."
    assert page.get_attribute("#stream-status", "aria-live") == "polite"


def overflows(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")


def shot(page, name: str, *, full_page: bool = False) -> None:
    artifacts = settings.BASE_DIR / "artifacts"
    artifacts.mkdir(exist_ok=True)
    page.screenshot(path=str(artifacts / name), full_page=full_page)


def test_the_streamed_playground_keeps_up_and_passes_axe(page, live_server):
    """Recent runs update without a reload, focus follows the replaced controls, the status line
    is announced, a streamed denial says who denied, and axe-core finds nothing on the index,
    a streamed run waiting for approval or a batch result."""
    config(
        "triage",
        [
            {
                "tool_calls": [
                    {"name": "list_notes", "arguments": {}},
                    {
                        "name": "create_note",
                        "arguments": {"title": "Escalate", "body": "Call back."},
                    },
                ]
            },
            {"content": "Left it alone."},
        ],
        name="Ticket triage",
    )
    page.goto(f"{live_server.url}/playground/")
    assert (
        page.get_attribute("meta[name=viewport]", "content")
        == "width=device-width, initial-scale=1"
    )
    assert page.locator("main").count() == 1
    assert "No runs yet" in page.inner_text("#history-section")
    assert_accessible(page)

    page.select_option("select[name=configuration]", "triage")
    page.fill("textarea[name=prompt]", "Triage ticket 4711")
    page.focus("#run-streamed")
    page.keyboard.press("Enter")
    page.wait_for_selector("#outcome [data-outcome=awaiting_approval]")
    run = AgentRun.objects.get()
    # Recent runs caught up without a reload; focus is back on the button it was on.
    assert page.locator(f"#history tr[data-run='{run.uuid}']").count() == 1
    assert "waiting for approval" in page.inner_text("#history")
    assert page.evaluate("document.activeElement.id") == "run-streamed"
    assert page.inner_text("#stream-status") == "Run now waits for approval."
    # The write comes first with its arguments open; the read folds; words, not slugs.
    outcome = page.locator("#outcome")
    calls = outcome.locator(".call-write, .call-read")
    assert calls.nth(0).get_attribute("class") == "call-write"
    assert "Write (non-idempotent: not safe to repeat)" in calls.nth(0).inner_text()
    assert "Read (changes nothing)" in calls.nth(1).inner_text()
    assert calls.nth(1).locator("> details").count() == 1  # the read's arguments, folded
    # Each call has its verdict: a group named for the call, the answer and edit folded.
    verdict = calls.nth(1).get_by_role("group", name="Your verdict on call 1 of 2: list_notes")
    assert verdict.locator("details").count() == 2
    assert "non_idempotent_write" not in page.inner_text("body")
    assert_accessible(page)
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, "playground-1280.png", full_page=True)
    page.set_viewport_size({"width": 400, "height": 900})
    assert not overflows(page), "the playground scrolls sideways at 400 px"
    assert_accessible(page)
    shot(page, "playground-400.png")
    page.set_viewport_size({"width": 1280, "height": 900})

    # Deny from the keyboard: the form goes, focus moves to what replaced it, not the body.
    outcome.get_by_role("button", name="Deny").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#outcome [data-outcome=completed]")
    assert page.evaluate("document.activeElement.id") == "outcome"
    assert "Denied by dev" in page.inner_text("#trace")
    assert "completed · completed" not in page.inner_text("#outcome").lower()
    streamed = page.locator("#trace [data-kind]").evaluate_all("n => n.map(e => e.dataset.kind)")
    assert "completed" in page.inner_text("#history")

    # The reloaded trace shows the same steps.
    page.goto(f"{live_server.url}/playground/runs/{run.uuid}/")
    reloaded = page.locator("#trace [data-kind]").evaluate_all("n => n.map(e => e.dataset.kind)")
    assert reloaded == streamed
    assert "Denied by dev" in page.inner_text("#trace")
    assert_accessible(page)

    # A batch run's result page.
    page.goto(f"{live_server.url}/playground/")
    page.select_option("select[name=configuration]", "triage")
    page.fill("textarea[name=prompt]", "Batch this one")
    page.click("#run-batch")
    page.wait_for_selector("#outcome [data-outcome=waiting_for_approval]")
    assert_accessible(page)


def test_cancel_a_run_from_its_playground_page_after_a_confirmation(page, live_server):
    config(
        "notes",
        [{"tool_calls": [{"name": "create_note", "arguments": {"title": "t", "body": ""}}]}],
    )
    page.goto(f"{live_server.url}/playground/")
    page.select_option("select[name=configuration]", "notes")
    page.fill("textarea[name=prompt]", "Make a note")
    page.click("#run-batch")
    page.wait_for_selector("#outcome [data-outcome=waiting_for_approval]")
    page.click("#cancel-link")
    assert page.locator("h1").inner_text().startswith("Cancel run")
    assert_accessible(page)
    assert AgentRun.objects.get().status == Status.WAITING_FOR_APPROVAL  # nothing yet
    page.click("#confirm-cancel")
    page.wait_for_selector("#outcome [data-outcome=cancelled]")
    assert "Run cancelled." in page.inner_text(".messages")
    run = AgentRun.objects.get()
    assert run.status == Status.CANCELLED
    assert run.events.get(kind="cancel").payload["note"] == "cancelled in the playground"
    assert not Note.objects.exists()
