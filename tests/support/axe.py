"""axe-core in the browser tests: ``assert_accessible(page)`` runs axe-core (the copy shipped in
the ``axe-playwright-python`` package, injected into the page) and fails on every critical,
serious or moderate violation, naming the rule and the offending markup.

Everything on our pages is checked, what we render inside the admin and the admin's own
breadcrumb bar included (``agentruns/leasehold.css`` underlines its links, which Django tells
apart from the bar's text by colour alone). Swagger UI is not checked at all.
"""

from __future__ import annotations

from typing import Any

IMPACTS = ("critical", "serious", "moderate")


def axe_violations(page: Any, *, exclude: list[list[str]] | None = None) -> list[dict[str, Any]]:
    """Violations of critical, serious or moderate impact on ``page`` as axe-core reports them."""
    from axe_playwright_python.base import AXE_SCRIPT

    page.evaluate(AXE_SCRIPT)
    result = page.evaluate(
        "(args) => axe.run({exclude: args.exclude}, {resultTypes: ['violations']})",
        {"exclude": exclude or []},
    )
    return [v for v in result["violations"] if v.get("impact") in IMPACTS]


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']}")
        for node in v["nodes"][:5]:
            lines.append(f"    {node['target']}: {node['html'][:200]}")
    return "\n".join(lines)


def assert_accessible(page: Any, *, exclude: list[list[str]] | None = None) -> None:
    """No critical, serious or moderate axe-core violation on ``page`` (JavaScript on: axe-core
    runs in the page; for a page opened with JavaScript off use ``assert_accessible_copy``)."""
    found = axe_violations(page, exclude=exclude)
    assert not found, "axe-core found:\n" + describe(found)


def assert_accessible_copy(page: Any, *, exclude: list[list[str]] | None = None) -> None:
    """``assert_accessible`` for a page whose context has JavaScript off (axe-core cannot run
    there): the same URL, loaded again with the same cookies and window size in a context with
    JavaScript on. The page must be what a GET of its URL shows."""
    context = page.context.browser.new_context(viewport=page.viewport_size)
    try:
        context.add_cookies(page.context.cookies())
        copy = context.new_page()
        copy.goto(page.url)
        assert_accessible(copy, exclude=exclude)
    finally:
        context.close()
