"""Helpers for the inbox's browser tests: a page, a login, a card, the messages, a screenshot."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.urls import reverse

from tests.approvals.support.html import RUN_NAMED
from tests.support.browser import new_page as support_new_page

ARTIFACTS = Path(settings.BASE_DIR) / "artifacts"


def new_page(browser, *, width: int = 1280):
    """A fresh browser profile with JavaScript off: the inbox must work without it."""
    return support_new_page(
        browser, java_script_enabled=False, viewport={"width": width, "height": 900}
    )


def log_in(page, live_server, user) -> None:
    page.goto(f"{live_server.url}{reverse('admin:index')}")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_selector("#approvals-link")


def card(page, run):
    return page.locator(f"#run-{run.uuid}")


def named_messages(page) -> list[str]:
    """The messages as shown, each led by the run it is about ("Run 7b7e07e3 (Notes): …")."""
    page.wait_for_selector(".messagelist li")
    return [text.strip() for text in page.locator(".messagelist li").all_inner_texts()]


def messages(page) -> list[str]:
    """The messages without the run each names (``RUN_NAMED``)."""
    return [
        match["rest"] if (match := RUN_NAMED.match(text)) else text for text in named_messages(page)
    ]


def overflows(page) -> bool:
    """Whether the page is wider than its window (it would scroll sideways)."""
    return page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")


def screenshot(page, name: str, *, full_page: bool = True) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    return path
