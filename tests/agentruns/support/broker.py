"""The Redis broker's queue, as the tests that read it name it."""

from __future__ import annotations

#: django-q2's task list in Redis for the cluster named ``leasehold`` (config/settings/base.py).
QUEUE_KEY = "django_q:leasehold:q"
