"""The arrows between apps point one way (STYLE.md): read from the source, statically.

``approvals -> agentruns`` and ``playground -> agentruns``; ``agentruns`` and ``approvals``
never import the host project (``config``); DRF is imported only by ``agentruns/api``; a
provider's contract (``providers/base.py``) imports no implementation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DRF = ("rest_framework", "drf_spectacular")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def sources(app: str) -> list[Path]:
    return sorted((ROOT / app).rglob("*.py"))


def offenders(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        bad = sorted(
            name
            for name in imported_modules(path)
            if any(name == f or name.startswith(f + ".") for f in forbidden)
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


@pytest.mark.parametrize(
    ("app", "forbidden"),
    [
        ("agentruns", ("config", "approvals", "playground")),
        ("approvals", ("config", "playground", *DRF)),
    ],
)
def test_an_app_imports_neither_its_host_project_nor_its_callers(
    app: str, forbidden: tuple[str, ...]
) -> None:
    assert offenders(sources(app), forbidden) == {}


def test_only_the_api_imports_drf() -> None:
    outside_api = [p for p in sources("agentruns") if "api" not in p.relative_to(ROOT).parts[1:2]]
    assert offenders(outside_api, DRF) == {}


def test_the_provider_contract_imports_no_implementation() -> None:
    base = ROOT / "agentruns" / "providers" / "base.py"
    assert {m for m in imported_modules(base) if m.startswith("agentruns")} == set()
