"""Root fixtures shared by every app's tests.

Tests marked ``postgres`` need PostgreSQL. Without it they skip locally and **fail** under
``CI=true`` (CI deselects them with ``-m "not postgres"`` on its SQLite pass instead).
"""

from __future__ import annotations

import os

import pytest
from django.db import connection


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def require_postgres() -> None:
    if on_postgres():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("this test needs PostgreSQL (DATABASE_URL=postgres://...), which is missing")
    pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://...)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("postgres") and "require_postgres" not in getattr(
            item, "fixturenames", []
        ):
            item.fixturenames.insert(0, "require_postgres")
