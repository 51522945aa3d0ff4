"""The README's service: debug on, SQLite by default, every host of this machine."""

import os

from .base import *  # noqa: F403
from .base import AGENTRUNS, env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)
# Notification digests link to the cards on the README's server unless told otherwise.
AGENTRUNS = {
    **AGENTRUNS,
    "SITE_URL": os.environ.get("AGENTRUNS_SITE_URL", "http://127.0.0.1:8000"),
}
