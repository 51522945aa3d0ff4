"""Every page Leasehold adds, in headless Chromium at 1280 and 375 px: no critical, serious or
moderate axe-core violation (the admin's breadcrumbs included), one navigation bar, and our own
pages never scroll sideways; the timeline is a list below 600 px.

The pages: the playground (start, a run waiting with a refusal in words, cancel), the inbox, the
recent runs, a run's timeline and its cancel page, the dashboard, the admin's run list and run
page, the admin's front page, and the demo receiver's page.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.db.models import Q

from agentruns.models import AgentConfiguration, AgentRun, Status
from agentruns.services import runs
from playground.receiver import DemoReceiver
from tests.approvals.conftest import make_in_doubt_run
from tests.approvals.support.browser import screenshot
from tests.playground.conftest import join_streams
from tests.support.axe import assert_accessible
from tests.support.browser import new_page

pytestmark = pytest.mark.browser

WIDTHS = [1280, 375]


@pytest.fixture
def receiver(settings) -> Iterator[DemoReceiver]:
    demo = DemoReceiver().start()
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [demo.netloc]}
    try:
        yield demo
    finally:
        demo.stop()


@pytest.fixture
def demo(receiver, monkeypatch):
    """``seed_demo``'s users and configurations, and a run of each kind: completed, waiting
    for approval (a note, a webhook), for input, in doubt, a delivery at the receiver."""
    call_command(
        "seed_demo", "--force", "--webhook-url", receiver.url("/hooks/x"), stdout=StringIO()
    )
    User = AgentConfiguration._meta.apps.get_model("auth", "User")
    admin, colleague = User.objects.get(username="admin"), User.objects.get(username="colleague")
    group = Group.objects.create(name="Release managers")
    group.permissions.add(
        Permission.objects.get(Q(content_type__app_label="playground", codename="approve_webhooks"))
    )

    def start(slug: str, user) -> AgentRun:
        configuration = AgentConfiguration.objects.get(slug=slug)
        return runs.run_start_sync(
            configuration=configuration, prompt=f"{slug} now", initiator=user
        ).run

    note = start("notes-assistant", colleague)
    webhook = start("webhook-sender", colleague)
    start("ask-a-human", colleague)
    start("note-editor", colleague)
    done = start("webhook-sender", admin)
    runs.run_decide(
        run_uuid=done.uuid,
        actor=admin,
        approved=True,
        turn_digest=done.pending_turn["turn_digest"],
        mode="inline",
    )
    make_in_doubt_run(decider=admin, initiator=colleague, monkeypatch=monkeypatch)
    return {"admin": admin, "colleague": colleague, "note": note, "webhook": webhook, "done": done}


def log_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", username)
    page.click("input[type=submit]")
    page.wait_for_load_state()


def overflows(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")


def check(page, url: str, *, ours: bool = True) -> None:
    page.goto(url)
    assert page.locator("nav.lh-nav").count() == (1 if ours else 0), url
    assert_accessible(page)
    if ours:
        assert not overflows(page), f"{url} scrolls sideways at {page.viewport_size['width']} px"


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_we_add_passes_axe(browser, live_server, receiver, demo, width):
    page = new_page(browser, viewport={"width": width, "height": 900})
    try:
        log_in(page, live_server, "admin")
        base = live_server.url
        done, note = demo["done"], demo["note"]
        for path in (
            "/playground/",
            f"/playground/runs/{note.uuid}/",
            f"/playground/runs/{done.uuid}/",
            f"/playground/runs/{note.uuid}/cancel/",
            "/admin/approvals/",
            "/admin/approvals/runs/",
            f"/admin/approvals/runs/{done.uuid}/",
            f"/admin/approvals/runs/{note.uuid}/cancel/",
            "/admin/agentruns/agentrun/dashboard/",
            "/admin/agentruns/agentrun/",
            f"/admin/agentruns/agentrun/{done.pk}/change/",
            "/admin/agentruns/agentrunevent/",
            f"/admin/agentruns/agentrunevent/{done.events.first().pk}/change/",
        ):
            # The admin's own tables (its change list) may scroll at 375 px; ours may not.
            check(page, base + path)
        page.goto(f"{base}/admin/")
        assert_accessible(page)
        check(page, receiver.url("/"), ours=False)
        assert page.locator("#deliveries tbody tr").count() == 1

        # As colleague, who may not approve webhooks: the refusal names the permission in
        # words and the group that holds it, on the playground and on the inbox's card.
        page.context.clear_cookies()
        log_in(page, live_server, "colleague")
        webhook = demo["webhook"]
        for path in (f"/playground/runs/{webhook.uuid}/", "/admin/approvals/"):
            check(page, base + path)
            text = page.inner_text("body")
            assert "“Can approve calls of call_webhook” (playground.approve_webhooks)" in text
            assert "held by the group “Release managers”, and by every superuser" in text
    finally:
        page.context.close()
        join_streams()


def test_the_timeline_is_a_list_at_375_px(browser, live_server, receiver, demo):
    page = new_page(browser, viewport={"width": 375, "height": 800})
    try:
        log_in(page, live_server, "admin")
        done = demo["done"]
        page.goto(f"{live_server.url}/admin/approvals/runs/{done.uuid}/")
        assert not overflows(page)
        table = page.locator("table.approvals-timeline")
        assert table.evaluate("t => getComputedStyle(t).display") == "block"
        assert page.locator("table.approvals-timeline thead").is_hidden() is False  # for readers
        # Every value of an event is in view, labelled: the decider and the time included.
        approval = page.locator("table.approvals-timeline tr", has_text="Approved: call_webhook")
        decider = approval.locator('td[data-label="Decider"]')
        when = approval.locator('td[data-label="When"]')
        assert decider.inner_text() == "admin"
        for cell in (decider, when):
            box = cell.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375
        label = when.evaluate("td => getComputedStyle(td, '::before').content")
        assert label == '"When: "'
        screenshot(page, "timeline-375.png")
        # The refused call reads as refused, never as a failure that ran.
        assert "ran — failed" not in page.inner_text("table.approvals-timeline")
    finally:
        page.context.close()
        join_streams()


def test_a_refused_webhook_reads_refused_not_sent(browser, live_server, settings, demo):
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": []}
    admin = demo["admin"]
    run = runs.run_start_sync(
        configuration=AgentConfiguration.objects.get(slug="webhook-sender"),
        prompt="send it",
        initiator=admin,
    ).run
    runs.run_decide(
        run_uuid=run.uuid,
        actor=admin,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    assert run.output.startswith("The webhook was refused before anything was sent")
    page = new_page(browser, viewport={"width": 1280, "height": 900})
    try:
        log_in(page, live_server, "admin")
        page.goto(f"{live_server.url}/admin/approvals/runs/{run.uuid}/")
        timeline = page.inner_text("table.approvals-timeline")
        assert "call_webhook — Write (non-idempotent: not safe to repeat): refused — not sent" in (
            timeline
        )
        assert "failed" not in timeline
        page.goto(f"{live_server.url}/playground/runs/{run.uuid}/")
        assert "refused — not sent" in page.inner_text("#trace [data-kind=tool]")
    finally:
        page.context.close()
        join_streams()
