"""What every benchmark needs before it measures: a throwaway database and Django set up on it,
and for the benchmarks over a large run table (``reaper_scale``, ``deadline_pass``) the table
grown by copying one row, put into its states in one statement, and a raw guarded ``UPDATE``
floor to measure against.

The developer's database is never touched: a PostgreSQL benchmark creates ``<prefix>_<pid>`` on
the server of ``DATABASE_URL`` and drops it (``WITH (FORCE)``) on the way out, even after an
error. Import as ``benchmarks._support`` after putting ``ROOT`` on ``sys.path`` (the scripts run
as files, and django-q2 workers import them as ``benchmarks.<name>``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
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


def grow_table(total: int) -> None:
    """Grow the run table to ``total`` rows, copying a template row (every column Django knows)."""
    from django.db import connection

    from agentruns.models import AgentConfiguration, AgentRun, Status

    current = AgentRun.objects.count()
    if current >= total:
        return
    if current == 0:
        configuration = AgentConfiguration.objects.create(slug="bench", name="bench")
        AgentRun.objects.create(configuration=configuration, prompt="p", status=Status.COMPLETED)
        current = 1
    table = AgentRun._meta.db_table
    columns = [f.column for f in AgentRun._meta.concrete_fields if f.column not in ("id", "uuid")]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (uuid, {', '.join(columns)}) "
            f"SELECT gen_random_uuid(), {', '.join('t.' + c for c in columns)} "
            f"FROM (SELECT * FROM {table} ORDER BY id LIMIT 1) t, generate_series(1, %s)",
            [total - current],
        )


def reset_table(assignments: str, params: Sequence[object] | None = None) -> int:
    """Put every run in its state (``UPDATE <table> SET <assignments>``, which decides by
    ``id % 100``; with ``params``, a literal ``%`` is written ``%%``); forget events and queued
    tasks; analyze. Returns the number of target runs, those with ``id % 100 = 0``."""
    from django.db import connection

    from agentruns.models import AgentRun

    table = AgentRun._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE agentruns_agentrunevent, django_q_ormq")
        cursor.execute(f"UPDATE {table} SET {assignments}", params)
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(f"SELECT count(*) FROM {table} WHERE id % 100 = 0")
        return cursor.fetchone()[0]


def raw_floor(url: str, count: int, update: str) -> float:
    """Seconds for ``count`` guarded single-row UPDATEs of the target runs (``id % 100 = 0``),
    one transaction each, through psycopg: ``update`` is the statement, with ``{table}`` for
    the run table and ``%s`` for the run's id."""
    import psycopg

    from agentruns.models import AgentRun

    table = AgentRun._meta.db_table
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {table} WHERE id % 100 = 0")]
        started = time.perf_counter()
        for run_id in ids[:count]:
            conn.execute(update.format(table=table), [run_id])
        return time.perf_counter() - started
