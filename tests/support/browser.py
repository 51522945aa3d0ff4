"""Headless Chromium for the browser tests, launched once the same way for every app.

Uses Debian's ``/usr/bin/chromium`` (``.ci/run`` installs it) through Playwright's Python
package. Without either the ``browser`` fixture skips locally and **fails** under ``CI=true``.

Playwright's sync API runs an event loop, so the fixture sets ``DJANGO_ALLOW_ASYNC_UNSAFE``;
ORM calls made while it runs open their own connection (Django keeps connections per context),
so teardown closes every connection or PostgreSQL cannot drop the test database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 20_000


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser tests need {reason}, which is missing")
    pytest.skip(f"needs {reason}")


@pytest.fixture
def browser(live_server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A headless Chromium ``Browser`` next to the live server; closed after the test."""
    if not os.access(CHROMIUM, os.X_OK):
        _missing(CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright's Python package (pip install playwright)")

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
            connections.close_all()


def new_page(browser: Any, **context_options: Any) -> Any:
    """A page in a fresh browser profile (``context_options`` go to ``new_context``)."""
    page = browser.new_context(**context_options).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    return page
