"""Production: PostgreSQL through DATABASE_URL, a real secret, HTTPS only.

Every switch is read from the environment and defaults to the strict setting:

- ``DJANGO_SECRET_KEY`` (required) and ``DJANGO_ALLOWED_HOSTS``.
- ``DJANGO_SECURE_SSL_REDIRECT`` (on): plain http is redirected to https.
- ``DJANGO_SECURE_HSTS_SECONDS`` (31536000, a year; ``0`` sends no HSTS header),
  ``DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS`` (on), ``DJANGO_SECURE_HSTS_PRELOAD`` (on).
- ``DJANGO_SECURE_PROXY_SSL_HEADER`` (off): behind a proxy that terminates TLS, turn it on to
  trust its ``X-Forwarded-Proto: https`` (only if the proxy always sets the header and strips a
  client's own), or turn ``DJANGO_SECURE_SSL_REDIRECT`` off and let the proxy redirect; without
  either, every request to Django looks like http and the redirect never ends.
- ``DJANGO_SECURE_COOKIES`` (on): session and CSRF cookies only over https.
- ``AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION`` (off): production refuses SQLite, which has no row
  locks and is right for one machine only (README, "SQLite and PostgreSQL").
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import DATABASES, env_bool

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "config.settings.production needs DJANGO_SECRET_KEY: a long random value, e.g. from "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
DEBUG = False

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and not env_bool(
    "AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION", False
):
    raise ImproperlyConfigured(
        "config.settings.production refuses SQLite (DATABASE_URL is unset or a sqlite:// URL): "
        "set DATABASE_URL=postgres://… (PostgreSQL is the production database), or set "
        "AGENTRUNS_ALLOW_SQLITE_IN_PRODUCTION=1 to run on SQLite on one machine on purpose."
    )

SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
try:
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS") or 31536000)
except ValueError:
    raise ImproperlyConfigured(
        "DJANGO_SECURE_HSTS_SECONDS must be a whole number of seconds (0 turns HSTS off)"
    ) from None
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", True)
if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
