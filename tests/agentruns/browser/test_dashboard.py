"""The dashboard in headless Chromium: a staff member logs in, follows the admin index's link,
and sees every chart drawn with data — with JavaScript off, at 1280 and 400 px, without a console
error, without a request leaving the server, and without a serious axe-core violation."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.urls import reverse

from agentruns.dashboard.charts import CHARTS
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.dashboard import varied_history
from tests.support.axe import assert_accessible
from tests.support.browser import new_page

pytestmark = pytest.mark.browser

ARTIFACTS = Path(settings.BASE_DIR) / "artifacts"


def watch(page, live_server) -> tuple[list[str], list[str]]:
    """Console errors and page errors; requests to any host but the live server."""
    errors: list[str] = []
    outside: list[str] = []
    ours = urlsplit(live_server.url).netloc

    def console(message) -> None:
        # Chromium's own request for /favicon.ico (the project has none) is not the page's.
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            errors.append(f"{message.text} at {message.location}")

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "response",
        lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    page.on(
        "request",
        lambda r: (
            outside.append(r.url)
            if urlsplit(r.url).scheme in {"http", "https"} and urlsplit(r.url).netloc != ours
            else None
        ),
    )
    return errors, outside


def log_in(page, live_server, user) -> None:
    page.goto(f"{live_server.url}{reverse('admin:index')}")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#dashboard-link")


def charts_drawn(page) -> dict[str, int]:
    """Per chart section: how many bars or points pygal drew with a value."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('section.lh-chart')].map(
            s => [s.id, s.querySelectorAll('svg.pygal-chart .series .value, svg.pygal-chart '
                + '.series rect.rect').length]))"""
    )


@pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])
def test_staff_open_the_dashboard_and_see_the_charts(browser, live_server, javascript):
    varied_history()
    staff = UserFactory(username="ops", permissions=["agentruns.view_all_agentruns"])
    page = new_page(
        browser, java_script_enabled=javascript, viewport={"width": 1280, "height": 900}
    )
    errors, outside = watch(page, live_server)
    log_in(page, live_server, staff)

    page.click("#dashboard-link a")
    assert page.locator("h1").inner_text() == "Operations dashboard"
    drawn = charts_drawn(page)
    assert set(drawn) == {f"chart-{c.slug}" for c in CHARTS}
    assert all(n > 0 for n in drawn.values()), drawn
    assert page.locator(".lh-chart-empty").count() == 0
    # The numbers behind a chart, in words, without JavaScript.
    numbers = page.locator("#chart-waiting-now details")
    numbers.locator("summary").click()
    assert "over 1 day" in numbers.locator("table").inner_text()
    if javascript:
        assert_accessible(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

    page.set_viewport_size({"width": 400, "height": 900})
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    widths = page.evaluate(
        "[...document.querySelectorAll('svg.pygal-chart')]"
        ".map(s => s.getBoundingClientRect().width)"
    )
    assert len(widths) == len(CHARTS) and all(0 < w <= 400 for w in widths), widths
    if javascript:
        assert_accessible(page)
        page.screenshot(path=str(ARTIFACTS / "dashboard-400.png"), full_page=True)

    assert not errors, errors
    assert not outside, outside


def test_staff_without_the_permission_see_a_refusal(browser, live_server):
    staff = UserFactory(username="plain", permissions=["agentruns.view_agentrun"])
    page = new_page(browser, java_script_enabled=False)
    page.goto(f"{live_server.url}{reverse('admin:index')}")
    page.fill("#id_username", "plain")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    assert page.locator("#dashboard-link").count() == 0
    response = page.goto(f"{live_server.url}{reverse('admin:agentruns_dashboard')}")
    assert response.status == 403
    assert page.locator("svg.pygal-chart").count() == 0
    assert staff.is_staff
