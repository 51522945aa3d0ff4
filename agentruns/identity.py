"""Execution identity: ``<segment>:<host>:<pid>``, the value of ``claimed_by``.

A lease left behind names the entry point that abandoned it (docs/design.md §3.1).
"""

from __future__ import annotations

import os
import socket

from agentruns.models import AgentRun, Segment

_MAX = AgentRun._meta.get_field("claimed_by").max_length


def execution_identity(segment: Segment | str) -> str:
    """The identity of a segment of this process, truncated to the ``claimed_by`` column."""
    value = str(segment.value if isinstance(segment, Segment) else segment)
    return f"{value}:{socket.gethostname()}:{os.getpid()}"[:_MAX]


def reaper_identity() -> str:
    return f"reaper:{socket.gethostname()}:{os.getpid()}"[:_MAX]
