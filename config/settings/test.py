"""Tests: the same databases as production paths, a file-based SQLite test database.

SQLite concurrency tests need a file (the in-memory test database fails with "table is
locked"). TEST_DB_NAME lets parallel checkouts use separate test databases.
"""

import os

from .base import *  # noqa: F403
from .base import BASE_DIR, DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "test-secret-key"

_test_name = os.environ.get("TEST_DB_NAME")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f"{_test_name or 'test_db'}.sqlite3")}
elif _test_name:
    DATABASES["default"]["TEST"] = {"NAME": _test_name}

Q_CLUSTER = {**Q_CLUSTER, "sync": False}  # noqa: F405
LOGGING["root"]["level"] = "WARNING"  # noqa: F405
