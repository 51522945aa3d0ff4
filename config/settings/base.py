"""Settings shared by every environment.

Every setting that ops may need to change is read from the environment here, so that the
per-environment modules only change defaults.
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url

from agentruns import conf as agentruns_conf

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-local-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # Before the admin: its admin/index.html (the inbox link) overrides the admin's own.
    "approvals",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc served from our static files (no CDN)
    "django_q",
    "agentruns",
    "playground",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "agentruns.middleware.TimeZoneMiddleware",  # a user's own zone, if they have one
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


# --- Database ----------------------------------------------------------------------------
# DATABASE_URL selects the database; the default is a SQLite file next to manage.py.
# PostgreSQL is the production database. SQLite is the embedded default for one machine:
# it has no row locks (select_for_update is ignored), so IMMEDIATE transactions serialise
# every writer instead — correct on one host, wrong for workers on several machines.

SQLITE_OPTIONS = {
    # Take the write lock at BEGIN, so read-check-write transactions never deadlock-upgrade.
    "transaction_mode": "IMMEDIATE",
    # Seconds a writer waits for the lock before "database is locked".
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def database_from_env(default_sqlite: Path) -> dj_database_url.DBConfig:
    config = dj_database_url.config(
        default=f"sqlite:///{default_sqlite}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "0")),
        conn_health_checks=env_bool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config.setdefault("OPTIONS", {}).update(SQLITE_OPTIONS)
    return config


DATABASES = {"default": database_from_env(BASE_DIR / "db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
# The zone pages show times in (and name), unless a user has their own (agentruns.middleware).
TIME_ZONE = os.environ.get("DJANGO_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "admin:login"

# --- Leasehold -----------------------------------------------------------------------------
# The defaults, each with what it means, live in agentruns.conf.DEFAULTS. Every key can be
# overridden by the environment variable AGENTRUNS_<KEY> (see agentruns.conf for the parsing:
# integers, floats, booleans and comma-separated lists).
AGENTRUNS = agentruns_conf.settings_from_env(os.environ)

# --- Email (notification digests) ------------------------------------------------------------
# The console backend by default: a digest is printed by the worker that sends it. For real mail
# set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and the EMAIL_* variables.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = int(os.environ.get("EMAIL_TIMEOUT", "10"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "leasehold@localhost")

# --- django-q2 -------------------------------------------------------------------------------
# The ORM broker is the default: a task row is written on the caller's own connection, so it
# commits or rolls back with the state change. Q_BROKER=redis (with REDIS_URL) selects Redis,
# which loses a task whose worker was SIGKILLed; the reaper's redispatch covers that.
Q_CLUSTER = {
    "name": "leasehold",
    "workers": int(os.environ.get("Q_WORKERS", "2")),
    "queue_limit": int(os.environ.get("Q_QUEUE_LIMIT", "2")),
    "bulk": 1,
    # A task may run this long; it must exceed the longest segment (tool timeout x calls).
    "timeout": int(os.environ.get("Q_TIMEOUT", "600")),
    # Must exceed timeout plus the worst queue wait, or django-q2 re-presents running tasks.
    "retry": int(os.environ.get("Q_RETRY", "900")),
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "poll": float(os.environ.get("Q_POLL", "0.5")),
    "save_limit": 1000,
    "label": "Queue (django-q2)",
}
if os.environ.get("Q_BROKER", "orm") == "redis":
    Q_CLUSTER["redis"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
else:
    Q_CLUSTER["orm"] = "default"

# --- API -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.TokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Leasehold API",
    "DESCRIPTION": "Start, inspect, decide and cancel leased agent runs.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "StartModeEnum": "agentruns.api.serializers.MODE_CHOICES",
        "DecisionModeEnum": "agentruns.api.serializers.DECISION_MODE_CHOICES",
    },
}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
