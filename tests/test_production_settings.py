"""``config.settings.production``: strict by default, each switch off by environment, SQLite
refused unless allowed, ``check --deploy`` clean with the documented environment. Each case
starts a fresh process with only the environment it names, as a deployment would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

ROOT = Path(settings.BASE_DIR)
SECRET = "Jx8-vq2LZ0pR7wN4_tH9mK3sY6dF1bC5eA0gU8iO2lQ7nV4xW9zT3rS6yP1hM5jE"

# The production environment README.md documents ("Running in production").
DOCUMENTED = {
    "DJANGO_SETTINGS_MODULE": "config.settings.production",
    "DJANGO_SECRET_KEY": SECRET,
    "DJANGO_ALLOWED_HOSTS": "leasehold.example.com",
    "DATABASE_URL": "postgres://leasehold@db.example.com:5432/leasehold",
}

PROBE = """
import json
import django
django.setup()
from django.conf import settings
from django.test import Client

client = Client(HTTP_HOST="leasehold.example.com")
plain = client.get("/api/runs/")
secure = client.get("/api/runs/", secure=True)
forwarded = client.get("/api/runs/", HTTP_X_FORWARDED_PROTO="https")
print(json.dumps({
    "ssl_redirect": settings.SECURE_SSL_REDIRECT,
    "hsts_seconds": settings.SECURE_HSTS_SECONDS,
    "hsts_subdomains": settings.SECURE_HSTS_INCLUDE_SUBDOMAINS,
    "hsts_preload": settings.SECURE_HSTS_PRELOAD,
    "proxy_header": settings.SECURE_PROXY_SSL_HEADER,
    "session_cookie_secure": settings.SESSION_COOKIE_SECURE,
    "csrf_cookie_secure": settings.CSRF_COOKIE_SECURE,
    "debug": settings.DEBUG,
    "plain": [plain.status_code, plain.get("Location")],
    "secure_hsts": secure.get("Strict-Transport-Security"),
    "forwarded": [forwarded.status_code, forwarded.get("Strict-Transport-Security")],
}))
"""


def run(argv: list[str], **env: str | None) -> subprocess.CompletedProcess[str]:
    """``python <argv>`` in the repository with ``DOCUMENTED`` plus ``env`` (None unsets) and
    nothing else from this process's environment but ``PATH``."""
    environment: dict[str, str] = {"PATH": os.environ.get("PATH", ""), **DOCUMENTED}
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def probe(**env: str | None) -> dict[str, Any]:
    done = run(["-c", PROBE], **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_deploy(**env: str | None) -> subprocess.CompletedProcess[str]:
    return run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **env)


def test_check_deploy_is_clean_with_the_documented_environment():
    done = check_deploy()
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_https_is_enforced_by_default():
    found = probe()
    assert found["debug"] is False
    assert found["ssl_redirect"] is True
    assert found["plain"] == [301, "https://leasehold.example.com/api/runs/"]
    assert (found["hsts_seconds"], found["hsts_subdomains"], found["hsts_preload"]) == (
        31536000,
        True,
        True,
    )
    assert found["secure_hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert found["session_cookie_secure"] is True and found["csrf_cookie_secure"] is True
    # A proxy's header is not trusted unless asked for: a client could send it.
    assert found["proxy_header"] is None
    assert found["forwarded"] == [301, None]


def test_behind_a_tls_terminating_proxy_each_switch_is_an_environment_variable():
    trusting = probe(DJANGO_SECURE_PROXY_SSL_HEADER="1")
    assert trusting["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert trusting["forwarded"][0] != 301  # seen as https: answered, not redirected
    assert trusting["forwarded"][1] == "max-age=31536000; includeSubDomains; preload"

    relaxed = probe(
        DJANGO_SECURE_SSL_REDIRECT="0",
        DJANGO_SECURE_HSTS_SECONDS="0",
        DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS="0",
        DJANGO_SECURE_HSTS_PRELOAD="0",
    )
    assert relaxed["ssl_redirect"] is False and relaxed["plain"][0] != 301
    assert relaxed["hsts_seconds"] == 0 and relaxed["secure_hsts"] is None


def test_production_refuses_sqlite_unless_allowed():
    refused = check_deploy(DATABASE_URL=None)
    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr
    assert "config.settings.production refuses SQLite" in refused.stderr
    assert "AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION=1" in refused.stderr
    assert check_deploy(DATABASE_URL="sqlite:////tmp/leasehold.sqlite3").returncode != 0

    allowed = check_deploy(DATABASE_URL=None, AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION="1")
    assert allowed.returncode == 0, allowed.stderr


def test_production_refuses_to_start_without_a_secret_key():
    refused = check_deploy(DJANGO_SECRET_KEY=None)
    assert refused.returncode != 0
    assert "config.settings.production needs DJANGO_SECRET_KEY" in refused.stderr
