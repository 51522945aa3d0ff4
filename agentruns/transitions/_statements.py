"""The guarded statements of ``agentruns.transitions``, by name: ``sql/postgresql.sql`` and
``sql/sqlite.sql``, each read once, the first time a statement of its database is asked for.
Private: only the transitions' writer (``_writer``) uses it.

A file is a list of statements, each under a header line ``-- name --`` followed by comment
lines saying what it writes and its guard, then its SQL (parameters bound by name,
``%(name)s``). The comment lines are the reader's; the database is sent the SQL alone.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files

from django.db.backends.base.base import BaseDatabaseWrapper

HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
VENDORS = ("postgresql", "sqlite")


def parse(text: str) -> dict[str, str]:
    """The statements of ``text`` by name: each one's SQL without its comment lines (those
    before it describe it; those after it, up to the next header, head a group of statements)
    and without its closing ``;``."""
    parts = HEADER.split(text)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.startswith("--")]
        sql = "\n".join(lines).strip().removesuffix(";").rstrip()
        if name in statements or not sql:
            raise ValueError(f"statement {name!r}: defined twice, or empty")
        statements[name] = sql
    return statements


@functools.cache
def of_vendor(vendor: str) -> dict[str, str]:
    """Every statement of ``vendor``'s file (``postgresql`` or ``sqlite``), by name."""
    if vendor not in VENDORS:
        raise NotImplementedError(f"no statements for {vendor} (SQLite or PostgreSQL)")
    return parse((files("agentruns.transitions") / "sql" / f"{vendor}.sql").read_text("utf-8"))


def sql(db: BaseDatabaseWrapper, name: str) -> str:
    """The SQL of the statement ``name`` for ``db``'s database."""
    return of_vendor(db.vendor)[name]


def appends_events(db: BaseDatabaseWrapper, name: str) -> bool:
    """Whether the statement ``name`` appends the events it is given itself (it takes
    ``%(events)s``: PostgreSQL's data-modifying CTE), or they are appended after it."""
    return "%(events)s" in sql(db, name)
