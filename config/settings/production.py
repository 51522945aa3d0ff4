"""Production: PostgreSQL through DATABASE_URL, a real secret, secure cookies."""

import os

from .base import *  # noqa: F403
from .base import env_bool

SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
DEBUG = False
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
