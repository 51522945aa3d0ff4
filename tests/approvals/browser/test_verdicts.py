"""A verdict per call, several runs at once, and the one-line inbox, in headless Chromium with
JavaScript off (axe-core runs on a copy with it on): a reviewer edits a call on the card and
denies the other with a reason, approves the new card, and reads the reason in the model's next
request; the compact inbox is operated by keyboard at 375 px; invalid input stays on the inbox.

The README's screenshot of a card with per-call verdicts is ``artifacts/inbox-verdicts.png``
(copied to ``docs/``).
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.approvals.conftest import start_input_run, start_waiting_run
from tests.approvals.support.browser import (
    ARTIFACTS,
    card,
    log_in,
    messages,
    named_messages,
    new_page,
    overflows,
    screenshot,
)
from tests.support.axe import assert_accessible, assert_accessible_copy
from tests.support.browser import new_page as js_page

pytestmark = pytest.mark.browser

REASON = "Use the staging hook <instead> — the team is asleep"


def two_calls(initiator=None) -> AgentRun:
    result = runs.run_start_sync(
        configuration=AgentConfigurationFactory(name="Notes assistant", slug="notes-assistant"),
        prompt="Note the stand-up and tell the team",
        initiator=initiator,
        options={
            "script": [
                {
                    "tool_calls": [
                        {"name": "create_note", "arguments": {"title": "Stand-pu", "body": "9:30"}},
                        {
                            "name": "call_webhook",
                            "arguments": {"url": "https://hooks.invalid/team", "payload": {"n": 1}},
                        },
                    ]
                },
                {"content": "Noted; the team was not told."},
            ]
        },
    )
    assert result.run.status == Status.WAITING_FOR_APPROVAL
    return AgentRun.objects.get(pk=result.run.pk)


def focused_id(page) -> str:
    return page.evaluate("document.activeElement && document.activeElement.id")


def test_edit_a_call_deny_the_other_with_a_reason_approve_the_new_card_and_read_the_reason(
    browser, live_server, initiator
):
    reviewer = UserFactory(username="reviewer", is_superuser=True, is_staff=True)
    colleague = UserFactory(username="colleague", is_superuser=True, is_staff=True)
    run = two_calls(initiator)
    page = new_page(browser)
    log_in(page, live_server, reviewer)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    shown = card(page, run)
    first = shown.get_by_role("group", name="Your verdict on call 1 of 2: create_note")
    second = shown.get_by_role("group", name="Your verdict on call 2 of 2: call_webhook")

    first.get_by_label("Edit the arguments").check()
    first.get_by_text("The arguments, if you edit them").click()  # <details>: no script needed
    title = first.get_by_label("title (required)")
    assert title.input_value() == "Stand-pu"  # the model's value, filled in
    title.fill("Stand-up")
    second.get_by_label("Deny: do not run it").check()
    second.get_by_label("Reason, if you deny it").fill(REASON)
    ARTIFACTS.mkdir(exist_ok=True)
    shown.screenshot(path=str(ARTIFACTS / "inbox-verdicts.png"))
    assert_accessible_copy(page)

    shown.get_by_role("button", name="Send the verdicts chosen above").click()
    [said] = named_messages(page)
    assert said.startswith(f"Run {str(run.uuid)[:8]} (Notes assistant): Decided per call: ")
    assert "1 denied, 1 edited" in said and "Nothing runs yet" in said
    assert focused_id(page) == "outcome"  # the outcome takes the focus after the submit
    page.get_by_role("link", name=f"Run {str(run.uuid)[:8]}").click()
    assert page.url.endswith(reverse("approvals:run", args=[run.uuid]))

    # A worker prepares the new card; the edit is not an approval. The editor is its author,
    # so a colleague approves it.
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "awaiting_approval"
    other = new_page(browser)
    log_in(other, live_server, colleague)
    other.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    again = card(other, run)
    assert "Arguments as edited by reviewer" in again.inner_text()
    assert '"title": "Stand-pu"' in again.locator(".lh-edited").inner_text()
    assert '"title": "Stand-up"' in again.locator(".lh-edited").inner_text()
    again.get_by_role("button", name="Approve").click()
    assert messages(other)[0].startswith("Approved.")
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    assert list(Note.objects.values_list("title", flat=True)) == ["Stand-up"]

    # The timeline: each call's verdict, the reason (escaped), the edit beside the original.
    other.goto(f"{live_server.url}{reverse('approvals:run', args=[run.uuid])}")
    timeline = other.locator("table.approvals-timeline").inner_text()
    assert "Denied by reviewer, did not run." in timeline and REASON in timeline
    assert "Run with the arguments as edited by reviewer" in timeline
    assert_accessible_copy(other)
    # The model's next request, in the run's trace: the reason, as the reviewer's words.
    other.get_by_role("link", name="the run's trace in the playground").click()
    request = other.locator(".step-request").nth(1)
    request.locator("summary", has_text="Messages sent").click()
    assert REASON in request.inner_text()
    assert "reason_given_by_the_reviewer" in request.inner_text()


def test_twenty_cards_at_once_in_the_browser_each_said(browser, live_server, decider, initiator):
    waiting = [start_waiting_run(initiator=initiator) for _ in range(3)]
    own = start_waiting_run(
        initiator=decider,
        configuration=AgentConfigurationFactory(name="Four eyes", require_second_approver=True),
    )
    page = new_page(browser)
    log_in(page, live_server, decider)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    for run in [*waiting, own]:
        card(page, run).get_by_label(f"Select run {str(run.uuid)[:8]}").check()
    page.get_by_role("button", name="Approve selected").click()
    said = messages(page)
    assert said[0] == "3 of 4 selected runs approved; 1 not (each says why below)."
    assert said[4] == "Not approved: A colleague must approve; you may deny."
    assert focused_id(page) == "outcome"
    assert all(AgentRun.objects.get(pk=r.pk).status == Status.QUEUED for r in waiting)
    assert_accessible_copy(page)


def test_the_one_line_inbox_by_keyboard_at_375_px_and_invalid_input_stays_on_it(
    browser, live_server, decider, initiator
):
    approval = start_waiting_run(initiator=initiator, arguments={"title": "Short", "body": "b"})
    asking = start_input_run(initiator=initiator, question="Which priority should it get?")
    page = new_page(browser, width=375)
    log_in(page, live_server, decider)
    compact = f"{live_server.url}{reverse('approvals:inbox')}?view=compact"
    page.goto(compact)
    rows = page.locator(".approvals-row")
    assert rows.count() == 2
    assert all(h < 120 for h in rows.evaluate_all("rows => rows.map(r => r.offsetHeight)"))
    assert not overflows(page), "the one-line inbox scrolls sideways at 375 px"
    assert_accessible_copy(page)
    screenshot(page, "inbox-compact-375.png", full_page=False)

    # Keyboard only: reach the run's line, open it, decide.
    summary = page.locator(f"#row-{approval.uuid} > summary")
    summary.focus()
    page.keyboard.press("Enter")
    assert page.locator(f"#row-{approval.uuid}").get_attribute("open") is not None
    deny = card(page, approval).get_by_role("button", name="Deny")
    deny.focus()
    page.keyboard.press("Enter")
    assert messages(page)[0].startswith("Denied:")
    assert page.url.endswith("?view=compact")

    # Invalid input: back on the inbox, the card open, the problem said once, in words.
    page.locator(f"#row-{asking.uuid} > summary").click()
    form = card(page, asking)
    form.get_by_label("Priority (0 or more) (optional)").fill("-1")
    form.get_by_role("button", name="Send input").click()
    assert page.locator("h1").inner_text() == "Approvals inbox"
    assert page.locator(f"#row-{asking.uuid}").get_attribute("open") is not None
    assert focused_id(page) == f"error-summary-{asking.pk}"
    body = page.inner_text("#content")
    assert body.count("greater than or equal to 0") == 1
    assert "invalid_input" not in body
    assert AgentRun.objects.get(pk=asking.pk).status == Status.WAITING_FOR_INPUT


def test_axe_on_a_card_whose_verdicts_came_back_with_problems(
    browser, live_server, client, decider, initiator
):
    """The 422 page is a POST's answer: axe runs on it in a context with JavaScript on."""
    run = two_calls(initiator)
    client.force_login(decider)
    page = js_page(browser, viewport={"width": 1280, "height": 900})
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    )
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    shown = card(page, run)
    shown.get_by_role("group", name="Your verdict on call 1 of 2: create_note").get_by_label(
        "Approve: run it"
    ).check()
    with page.expect_response(lambda r: r.url.endswith("/decision/")) as answer:
        shown.get_by_role("button", name="Send the verdicts chosen above").click()
    assert answer.value.status == 422
    assert focused_id(page) == f"error-summary-{run.pk}"
    assert "Choose what happens to this call." in card(page, run).inner_text()
    assert_accessible(page)
    page.set_viewport_size({"width": 375, "height": 800})
    assert not overflows(page)
    assert_accessible(page)
