"""Root fixtures shared by every app's tests.

Tests marked ``postgres`` need PostgreSQL. Without it they skip locally and **fail** under
``CI=true`` (CI deselects them with ``-m "not postgres"`` on its SQLite pass instead). Tests also
marked ``own_session`` inspect their connection's server session, which a transaction-mode
pooler does not keep: CI's pass through PgBouncer deselects them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

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


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test databases; before it drops them, the server sessions a pooler still
    keeps open on the test database (idle, for its next client) are ended, or ``DROP
    DATABASE`` refuses a database "being accessed by other users"."""
    yield
    if not on_postgres():
        return
    import psycopg

    db = connection.settings_dict
    with (
        django_db_blocker.unblock(),
        psycopg.connect(
            host=db.get("HOST") or "127.0.0.1",
            port=db.get("PORT") or 5432,
            user=db.get("USER") or None,
            password=db.get("PASSWORD") or None,
            dbname="postgres",
            autocommit=True,
        ) as admin,
    ):
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND state = 'idle' AND pid <> pg_backend_pid()",
            [db["NAME"]],
        )
