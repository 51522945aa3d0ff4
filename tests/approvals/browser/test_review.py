"""A digest's signed link in headless Chromium, JavaScript off: the recipient opens the link from
their email, signs in, lands on the confirmation page showing the whole card, and approves there.
Needs Debian's ``/usr/bin/chromium`` and Playwright (``tests/support/browser.py``)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.core import mail
from django.test import override_settings

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services.notifications import notifications_send
from tests.agentruns.factories import UserFactory
from tests.approvals.conftest import DECIDE, start_waiting_run
from tests.approvals.support.browser import messages, new_page, screenshot
from tests.support.axe import assert_accessible_copy

pytestmark = pytest.mark.browser


def test_the_recipient_opens_the_digest_link_signs_in_and_approves_from_the_confirmation_page(
    browser, live_server, initiator
):
    alice = UserFactory(username="alice", email="alice@example.com", permissions=[DECIDE])
    run = start_waiting_run(initiator=initiator, arguments={"title": "Launch", "body": "Go."})
    with override_settings(AGENTRUNS={**settings.AGENTRUNS, "SITE_URL": live_server.url}):
        notifications_send()
    [email] = [message for message in mail.outbox if message.to == ["alice@example.com"]]
    link = re.search(r"review and decide: (\S+)", email.body).group(1)
    assert link.startswith(live_server.url)

    page = new_page(browser)
    page.goto(link)  # signed out: the admin's sign-in first, then back to the link
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector(f"#run-{run.uuid}")
    assert page.url == link
    text = page.locator("#content-main").inner_text()
    assert "Nothing has been decided" in text
    assert "What will change:" in text and "creates a note titled 'Launch'" in text
    assert AgentRunEvent.objects.filter(run=run, kind="approval").count() == 0
    screenshot(page, "review-link.png")
    assert_accessible_copy(page)

    page.locator(f"#run-{run.uuid}").get_by_role("button", name="Approve").click()
    assert messages(page) == [
        "Approved. A worker continues the run; its timeline shows what happens next."
    ]
    assert page.url.endswith(f"/admin/approvals/runs/{run.uuid}/")
    event = AgentRunEvent.objects.get(run=run, kind="approval")
    assert event.actor == alice and event.payload["approved"] is True
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED

    page.goto(link)  # the link again: the run no longer waits, and the page says so
    assert "no longer waits for a decision" in page.locator("#content-main").inner_text()
