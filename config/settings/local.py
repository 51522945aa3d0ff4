"""The README's service: debug on, SQLite by default, every host of this machine."""

from .base import *  # noqa: F403
from .base import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)
