"""The README's first hour, walked in headless Chromium on a fresh database: ``seed_demo``, the
front door, the Notes assistant approved, the Webhook sender denied (an honest answer) and
approved (the demo receiver shows the one delivery).

Every name, button and answer the walk uses is read from the README's *The first hour* steps:
when the pages and the README part, this test fails at the step that no longer matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from agentruns.models import AgentRun, Status
from playground.models import Note
from playground.receiver import DemoReceiver
from tests.playground.conftest import join_streams
from tests.support.axe import assert_accessible
from tests.support.browser import new_page

pytestmark = pytest.mark.browser

README = Path(settings.BASE_DIR) / "README.md"


def first_hour_steps() -> dict[int, str]:
    """The numbered steps of the README's *The first hour*, each on one line."""
    text = README.read_text(encoding="utf-8")
    assert "### The first hour" in text, "the README has no 'The first hour' section"
    section = text.split("### The first hour", 1)[1].split("\n#", 1)[0]
    steps = re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |^\S|\Z)", section, flags=re.M | re.S)
    return {int(number): " ".join(body.split()) for number, body in steps}


def bold(step: str) -> list[str]:
    return re.findall(r"\*\*(.+?)\*\*", step)


def answer(step: str) -> str:
    """The answer a step says the run ends with: “…” after "the run ends:"."""
    found = re.search(r"the run ends: “(.+?)”", step)
    assert found, f"no answer quoted in: {step}"
    return found.group(1)


@pytest.fixture
def receiver(settings) -> Iterator[DemoReceiver]:
    demo = DemoReceiver().start()
    settings.AGENTRUNS = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": [demo.netloc]}
    try:
        yield demo
    finally:
        demo.stop()


def run_streamed(page, *, configuration: str | None, button: str) -> None:
    if configuration is not None:
        page.select_option("select[name=configuration]", label=configuration)
    page.fill("textarea[name=prompt]", "The first hour")
    page.get_by_role("button", name=button, exact=True).click()


def outcome(page, status: str) -> str:
    page.wait_for_selector(f"#outcome [data-status={status}]")
    return page.inner_text("#outcome .output")


def test_the_readme_s_first_hour(browser, live_server, receiver) -> None:
    steps = first_hour_steps()
    assert sorted(steps) == [1, 2, 3, 4, 5], steps
    call_command(
        "seed_demo", "--force", "--webhook-url", receiver.url("/hooks/deployed"), stdout=StringIO()
    )
    page = new_page(browser, viewport={"width": 1280, "height": 900})
    try:
        # 1. The front door leads to the admin's login, then back to / and on to the playground.
        user, password, landing = bold(steps[1])
        page.goto(f"{live_server.url}/")
        assert page.url == f"{live_server.url}/admin/login/?next=/"
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_url(f"{live_server.url}/playground/")
        assert page.inner_text("h1") == landing
        assert page.evaluate("fetch('/favicon.ico').then(r => r.ok)")  # no 404 on any page
        assert_accessible(page)

        # 2. The Notes assistant is the configuration chosen; streamed, it stops for approval.
        notes, run_button, approve, deny = bold(steps[2])
        chosen = page.eval_on_selector(
            "select[name=configuration]", "s => s.options[s.selectedIndex].text"
        )
        assert chosen == notes
        run_streamed(page, configuration=None, button=run_button)
        page.wait_for_selector("#outcome [data-status=waiting_for_approval]")
        assert page.locator("#trace [data-kind=tool]").count() == 1  # list_notes ran
        for label in (approve, deny):
            assert page.get_by_role("button", name=label, exact=True).count() == 1

        # 3. Approve: the note is created and the answer says so.
        [approve_again] = bold(steps[3])
        page.get_by_role("button", name=approve_again, exact=True).click()
        assert outcome(page, Status.COMPLETED) == answer(steps[3])
        assert Note.objects.filter(title="Stand-up").count() == 1
        assert "created the stand-up note" in page.inner_text("#trace")

        # 4. The Webhook sender, denied: nothing is sent, and the answer says why.
        sender, deny_button = bold(steps[4])
        run_streamed(page, configuration=sender, button=run_button)
        page.wait_for_selector("#outcome [data-status=waiting_for_approval]")
        page.get_by_role("button", name=deny_button, exact=True).click()
        assert outcome(page, Status.COMPLETED) == answer(steps[4])
        assert receiver.deliveries.all() == []

        # 5. Approved: one delivery, which the receiver's page shows with its key and token.
        approve_webhook, deliveries = bold(steps[5])
        run_streamed(page, configuration=sender, button=run_button)
        page.wait_for_selector("#outcome [data-status=waiting_for_approval]")
        page.get_by_role("button", name=approve_webhook, exact=True).click()
        assert outcome(page, Status.COMPLETED) == answer(steps[5])
        run = AgentRun.objects.filter(configuration__slug="webhook-sender").latest("created_at")
        [delivery] = receiver.deliveries.all()
        assert delivery.idempotency_key == f"{run.uuid}:call_0_0"
        assert delivery.fencing_token == str(run.lease_epoch)
        page.goto(receiver.url("/"))
        assert deliveries in page.inner_text("#deliveries caption")
        row = page.locator(f'#deliveries tr[data-key="{run.uuid}:call_0_0"]')
        assert row.count() == 1 and str(run.lease_epoch) in row.inner_text()
        assert_accessible(page)
    finally:
        page.context.close()
        join_streams()
