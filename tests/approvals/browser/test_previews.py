"""A write's preview on the inbox card, in headless Chromium with JavaScript off: the approver
reads what will change (before and after) and, when the note changed after the approval, is
asked again instead of the write running on what they did not see."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, Status
from agentruns.services import runs
from playground.models import Note
from tests.approvals.conftest import start_waiting_run
from tests.approvals.support.browser import card, log_in, messages, new_page, screenshot

pytestmark = pytest.mark.browser


def test_a_card_shows_the_before_and_after_of_an_update_and_asks_again_when_it_changed(
    browser, live_server, decider, initiator
):
    note = Note.objects.create(title="Quarterly report", body="draft")
    run = start_waiting_run(
        initiator=initiator, tool="update_note", arguments={"id": note.pk, "title": "Q3 report"}
    )
    page = new_page(browser)
    log_in(page, live_server, decider)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")

    preview = card(page, run).locator(".approvals-preview")
    assert f"updates note {note.pk} ('Quarterly report')" in preview.inner_text()
    rows = preview.locator("table.approvals-preview-changes tbody tr")
    assert rows.count() == 1
    assert [cell.strip() for cell in rows.first.locator("th, td").all_inner_texts()] == [
        "title",
        "Quarterly report",
        "Q3 report",
    ]
    assert "Checked again just before the call runs" in preview.inner_text()
    screenshot(page, "inbox-preview.png")

    card(page, run).get_by_role("button", name="Approve").click()
    assert messages(page)[0].startswith("Approved.")
    Note.objects.filter(pk=note.pk).update(title="Renamed by someone else")
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "awaiting_approval"

    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    again = card(page, run).locator("table.approvals-preview-changes tbody tr").first
    assert "Renamed by someone else" in again.inner_text()
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    note.refresh_from_db()
    assert note.title == "Renamed by someone else"
