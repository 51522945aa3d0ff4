"""What every benchmark needs before it measures: a throwaway database and Django set up on it.

The developer's database is never touched: a PostgreSQL benchmark creates ``<prefix>_<pid>`` on
the server of ``DATABASE_URL`` and drops it (``WITH (FORCE)``) on the way out, even after an
error. Import as ``benchmarks._support`` after putting ``ROOT`` on ``sys.path`` (the scripts run
as files, and django-q2 workers import them as ``benchmarks.<name>``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://root@127.0.0.1:5432/postgres"


def is_postgres(url: str) -> bool:
    return url.startswith(("postgres://", "postgresql://"))


def postgres_server(benchmark: str) -> str:
    """``DATABASE_URL`` (default: the local server); exits unless it is PostgreSQL."""
    server = os.environ.get("DATABASE_URL", DEFAULT_SERVER)
    if not is_postgres(server):
        sys.exit(f"{benchmark} needs a PostgreSQL DATABASE_URL")
    return server


@contextmanager
def throwaway_postgres(server_url: str, prefix: str) -> Iterator[str]:
    """Create database ``<prefix>_<pid>`` on ``server_url``'s server; yield its URL; drop it."""
    import psycopg

    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def production_environment(url: str) -> dict[str, str]:
    """``os.environ`` with production settings on ``url``: for this process or a child one."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="config.settings.production",
        DJANGO_SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "benchmark-only"),
        LOG_LEVEL="ERROR",
        PYTHONPATH=str(ROOT),
    )
    if not is_postgres(url):  # the SQLite comparison runs on one machine, on purpose
        env["AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION"] = "1"
    return env


def setup_django(environment: Mapping[str, str]) -> None:
    """Put ``environment`` into ``os.environ``, set Django up and migrate the database."""
    os.environ.update(environment)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
