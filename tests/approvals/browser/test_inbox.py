"""The inbox in headless Chromium, with JavaScript switched off: a staff member logs in and
approves a write; two browsers race on one card; the input form's 422 path; a reconciliation;
a card its reviewer may only deny.

Needs Debian's ``/usr/bin/chromium`` (``.ci/run`` installs it) and Playwright's Python package.
Decisions are queued (the inbox's default): where a test needs the continuation to happen, it
plays the worker itself by calling ``runs.run_process_queued`` — exactly what the django-q2 task
does — instead of starting a cluster.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import AgentRun, AgentRunEvent, Status
from agentruns.services import runs
from playground.models import Note
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory
from tests.approvals.conftest import make_in_doubt_run, start_input_run, start_waiting_run
from tests.approvals.support.browser import (
    card,
    log_in,
    messages,
    new_page,
    overflows,
    screenshot,
)
from tests.approvals.support.html import headings_in_order
from tests.support.axe import assert_accessible_copy

APPROVED = "Approved. A worker continues the run; its timeline shows what happens next."
REFUSED = {
    "Someone already decided this — nothing was changed.",
    "The pending action changed — review again.",
}

pytestmark = pytest.mark.browser


def test_staff_log_in_approve_a_write_and_see_the_run_complete(
    browser, live_server, decider, initiator
):
    run = start_waiting_run(initiator=initiator, arguments={"title": "Launch", "body": "Go."})
    page = new_page(browser)
    log_in(page, live_server, decider)
    page.click("#approvals-link a:text('Approvals inbox')")
    assert page.locator("h1").inner_text() == "Approvals inbox"
    assert card(page, run).locator("h4 code", has_text="create_note").count() == 1
    assert "Write (non-idempotent: not safe to repeat)" in card(page, run).inner_text()
    screenshot(page, "inbox-approval.png")

    card(page, run).get_by_role("button", name="Approve").click()
    assert messages(page) == [APPROVED]
    assert card(page, run).count() == 0
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED

    # The worker's turn (what the django-q2 task runs), then the staff member looks again.
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    page.click("nav.lh-nav >> text=Recent runs")
    row = page.locator("tr", has=page.locator(f"a[href$='{run.uuid}/']"))
    assert "completed" in row.inner_text()
    assert "someone other than who started it" in row.inner_text()
    row.locator("a").click()
    summary = page.locator("dl.approvals-summary").inner_text()
    assert "completed" in summary.lower()
    timeline = page.locator("table.approvals-timeline").inner_text()
    assert "approval decision" in timeline and "decider" in timeline
    assert Note.objects.filter(title="Launch").count() == 1


def test_two_browsers_approve_the_same_card_and_exactly_one_wins(
    browser, live_server, decider, colleague, initiator
):
    run = start_waiting_run(initiator=initiator)
    first, second = new_page(browser), new_page(browser)
    log_in(first, live_server, decider)
    log_in(second, live_server, colleague)
    for page in (first, second):
        page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
        assert card(page, run).count() == 1

    # Both click without waiting for an answer: the second may still be in flight or may land
    # on a run the first already decided — either way it must not win.
    for page in (first, second):
        card(page, run).get_by_role("button", name="Approve").click(no_wait_after=True)
    outcomes = sorted([messages(first)[0], messages(second)[0]])
    assert APPROVED in outcomes
    other = outcomes[1] if outcomes[0] == APPROVED else outcomes[0]
    assert other in REFUSED
    assert AgentRunEvent.objects.filter(run=run, kind="approval").count() == 1
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED


def test_invalid_input_comes_back_with_422_a_focused_summary_and_the_values_kept(
    browser, live_server, decider, initiator
):
    run = start_input_run(initiator=initiator)
    page = new_page(browser)
    log_in(page, live_server, decider)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    form = card(page, run)
    form.get_by_label("Priority (0 or more) (optional)").fill("-1")
    with page.expect_response(lambda r: r.url.endswith("/input/")) as answer:
        form.get_by_role("button", name="Send input").click()
    assert answer.value.status == 422

    summary = page.locator(f"#error-summary-{run.pk}")
    assert summary.evaluate("element => element === document.activeElement")
    assert "Correct “Your answer”" in summary.inner_text()
    # What is wrong is said once, beside the field (the summary links to it).
    assert page.inner_text("#content").count("This field is required.") == 1
    assert page.get_by_label("Priority (0 or more) (optional)").input_value() == "-1"
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_INPUT
    screenshot(page, "input-422.png")

    # The summary links to the field; fix it and send again.
    page.get_by_label("Your answer (required)").fill("Ship it")
    page.get_by_label("Priority (0 or more) (optional)").fill("2")
    page.get_by_role("button", name="Send input").click()
    assert messages(page)[0].startswith("Input sent.")
    event = AgentRunEvent.objects.get(run=run, kind="input")
    assert event.payload["values"] == {"answer": "Ship it", "priority": 2}


def test_a_reconciliation_decision(browser, live_server, decider, initiator, monkeypatch):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    key = f"{run.uuid}:{run.pending_turn['call']['id']}"
    page = new_page(browser)
    log_in(page, live_server, decider)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}?kind=reconciliation")
    text = card(page, run).inner_text()
    assert key in text and run.pending_turn["segment"] in text and "Its lease expired" in text

    card(page, run).get_by_role("button", name="It landed — continue").click()
    assert messages(page)[0].startswith("Recorded: the call took effect.")
    assert runs.run_process_queued(run_uuid=run.uuid).outcome == "completed"
    page.goto(f"{live_server.url}{reverse('approvals:run', args=[run.uuid])}")
    timeline = page.locator("table.approvals-timeline").inner_text()
    assert "Reconciled: the call took effect" in timeline and decider.get_username() in timeline
    assert not Note.objects.exists()  # confirmed as landed: never executed a second time


def test_every_card_type_in_one_inbox(browser, live_server, decider, initiator, monkeypatch):
    """The README's screenshot, and the accessibility checks a real browser can make."""
    make_in_doubt_run(
        decider=decider,
        initiator=initiator,
        monkeypatch=monkeypatch,
        configuration=AgentConfigurationFactory(name="Release notes", slug="release-notes"),
    )
    start_waiting_run(
        initiator=initiator,
        arguments={"title": "Customer <b>escalation</b>", "body": "Call them back. " * 60},
        configuration=AgentConfigurationFactory(
            name="Support notes", slug="support-notes", require_second_approver=True
        ),
    )
    start_input_run(
        initiator=initiator,
        question="Which priority should the ticket get?",
        configuration=AgentConfigurationFactory(name="Ticket triage", slug="ticket-triage"),
    )
    AgentRunFactory(
        configuration=AgentConfigurationFactory(name="Legacy importer", slug="legacy-importer"),
        status=Status.WAITING_FOR_APPROVAL,
        pending_turn={"kind": "approval", "calls": "?"},
        initiator=initiator,
        prompt="Import the old records",
    )
    page = new_page(browser, width=1100)
    log_in(page, live_server, decider)
    page.goto(f"{live_server.url}{reverse('approvals:inbox')}")
    kinds = page.locator(".approvals-kind").all_inner_texts()
    assert sorted(k.lower() for k in kinds) == sorted(
        ["waiting for reconciliation", "awaiting approval", "waiting for input", "unreadable"]
    )
    # A write's arguments are open, however long; a read's fold away (ask_human's call).
    write_args = page.locator(".approvals-call-write pre.approvals-args").all_text_contents()
    assert any("Customer <b>escalation</b>" in text for text in write_args)
    assert page.locator(".approvals-call-read details.approvals-args").count() == 1
    # The question leads the input card, above its form.
    assert (
        "Which priority should the ticket get?" in page.locator(".approvals-question").inner_text()
    )

    levels = [
        int(tag[1])
        for tag in page.locator("#content h1, #content h2, #content h3, #content h4").evaluate_all(
            "nodes => nodes.map(n => n.tagName.toLowerCase())"
        )
    ]
    assert headings_in_order(levels), levels
    unlabelled = page.locator(
        "#content input:not([type=hidden]), #content select, #content textarea"
    ).evaluate_all("nodes => nodes.filter(n => n.labels.length === 0).map(n => n.name)")
    assert unlabelled == []
    groups = page.locator("#content fieldset").evaluate_all(
        "nodes => nodes.map(n => n.querySelector('legend') && n.querySelector('legend').innerText)"
    )
    assert len(groups) == 5 and all(groups)  # the batch, each call's verdict, each decision
    assert_accessible_copy(page)
    assert screenshot(page, "inbox.png").stat().st_size > 10_000
    page.set_viewport_size({"width": 1280, "height": 900})
    screenshot(page, "inbox-1280.png")
    page.set_viewport_size({"width": 400, "height": 900})
    assert_accessible_copy(page)
    assert not overflows(page), "the inbox scrolls sideways at 400 px"
    page.set_viewport_size({"width": 320, "height": 900})
    assert not overflows(page), "the inbox (idempotency keys, inputs) scrolls sideways at 320 px"
    page.set_viewport_size({"width": 400, "height": 900})
    screenshot(page, "inbox-400.png", full_page=False)


def test_a_reviewer_without_the_tool_s_permission_sees_deny_only_and_what_is_missing(
    browser, live_server, decider, initiator
):
    """``call_webhook`` needs ``playground.approve_webhooks`` beside deciding (docs/design.md
    §5.6): ``decider`` holds only ``decide_agentrun``, a superuser holds everything."""
    run = start_waiting_run(
        initiator=initiator,
        tool="call_webhook",
        arguments={"url": "http://hooks.invalid/deployed", "payload": {"event": "deployed"}},
    )
    approver = UserFactory(username="root", is_superuser=True)
    reviewer, admin = new_page(browser), new_page(browser)
    log_in(reviewer, live_server, decider)
    log_in(admin, live_server, approver)
    for page in (reviewer, admin):
        page.goto(f"{live_server.url}{reverse('approvals:inbox')}")

    shown = card(reviewer, run)
    assert shown.get_by_role("button", name="Deny").count() == 1
    assert shown.get_by_role("button", name="Approve").count() == 0
    line = shown.locator(".approvals-missing")
    assert line.inner_text() == (
        "You may not approve this turn: approving call_webhook needs "
        "playground.approve_webhooks. You may deny it.\n\n"
        "“Can approve calls of call_webhook” (playground.approve_webhooks) is held by no group: "
        "only by superusers and by whoever it is given to."
    )
    # The decision's group is described by that line, for screen readers too.
    described = shown.locator("fieldset.approvals-decide").get_attribute("aria-describedby")
    assert described and reviewer.locator(f"#{described}").inner_text() == line.inner_text()
    screenshot(reviewer, "inbox-deny-only.png")

    # Someone who holds the permission gets both buttons and no such line.
    assert card(admin, run).get_by_role("button", name="Approve").count() == 1
    assert card(admin, run).locator(".approvals-missing").count() == 0

    shown.get_by_role("button", name="Deny").click()
    assert messages(reviewer)[0].startswith("Denied:")
    assert AgentRun.objects.get(pk=run.pk).status == Status.QUEUED


def test_cancel_from_the_timeline_without_javascript_and_axe_on_the_run_pages(
    browser, live_server, decider, initiator
):
    """The initiator cancels their own run from its timeline, through the confirmation step,
    with JavaScript off; the timeline, the confirmation and recent runs pass axe-core."""
    run = start_waiting_run(initiator=initiator)
    page = new_page(browser)
    log_in(page, live_server, initiator)
    assert_accessible_copy(page)  # the admin index, with our links to the inbox and playground
    page.goto(f"{live_server.url}{reverse('approvals:recent')}")
    assert_accessible_copy(page)
    page.click(f"a[href='{reverse('approvals:run', args=[run.uuid])}']")
    assert "Times are in UTC" in page.inner_text("#content-main")
    assert_accessible_copy(page)
    page.click(".approvals-summary a.approvals-cancel-link")
    assert page.locator("#content-main h2").first.inner_text().startswith("Cancel run")
    assert_accessible_copy(page)
    assert AgentRun.objects.get(pk=run.pk).status == Status.WAITING_FOR_APPROVAL
    page.get_by_role("button", name="Cancel the run").click()
    assert messages(page)[0].startswith("Run cancelled.")
    assert page.url.endswith(reverse("approvals:run", args=[run.uuid]))
    assert AgentRun.objects.get(pk=run.pk).status == Status.CANCELLED
    assert "cancelled in the approvals inbox" in page.inner_text(".approvals-timeline")
    page.set_viewport_size({"width": 320, "height": 800})
    assert not overflows(page), "the timeline scrolls sideways at 320 px"
