"""Making a write's preview (docs/design.md §5.10): when a turn suspends for approval, and again
before an approved call runs (compare-and-swap).

A preview runs under the segment's lease, unfenced, with ``PREVIEW_TIMEOUT_SECONDS`` in its
context; whatever it writes to the database is rolled back. It never blocks a decision: a preview
that raises, overruns its timeout, returns nothing or the wrong shape is a failed preview
carrying the exception's class only — the text goes to the log, as it can carry credentials.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from uuid import UUID

from django.db import transaction

from agentruns.conf import app_settings
from agentruns.leases import EventSpec
from agentruns.models import EventKind
from agentruns.tools import Tool, ToolContext
from agentruns.turns import Call, Preview, Turn

logger = logging.getLogger(__name__)


class PreviewTimedOut(Exception):
    """The preview returned after its timeout."""


def make_preview(
    tool: Tool, call: Call, *, run_uuid: UUID, initiator_id: int | None, fencing_token: int
) -> Preview | None:
    """``tool``'s preview of ``call``, bounded; ``None`` when the tool declares none."""
    if tool.preview is None:
        return None
    timeout = app_settings().preview_timeout_seconds
    context = ToolContext(
        run_uuid=run_uuid,
        call_id=call.id,
        initiator_id=initiator_id,
        fencing_token=fencing_token,
        timeout_seconds=timeout,
    )
    started = time.monotonic()
    try:
        with transaction.atomic():
            made = tool.preview(context, call.arguments)
            transaction.set_rollback(True)  # read-only: whatever it wrote is undone
        if time.monotonic() - started > timeout:
            raise PreviewTimedOut(f"the preview took longer than {timeout:g} s")
        if made is None:
            raise ValueError("the preview returned nothing")
        return Preview.bounded(made)
    except Exception as exc:
        logger.warning(
            "run %s: the preview of %s (%s) failed", run_uuid, call.name, call.id, exc_info=True
        )
        return Preview.failure(type(exc).__name__)


def preview_open_calls(
    turn: Turn,
    *,
    tool_of: Callable[[str], Tool | None],
    preview: Callable[[Tool, Call], Preview | None],
) -> None:
    """Give each open call of ``turn`` whose tool declares a preview a fresh one (in place)."""
    for index, call in enumerate(turn.calls):
        tool = tool_of(call.name)
        if call.id not in turn.done and tool is not None and tool.preview is not None:
            turn.calls[index] = replace(call, preview=preview(tool, call))


def preview_changed_event(call: Call, approved: Preview, fresh: Preview | None) -> EventSpec:
    """The ``verification`` event of a compare-and-swap that failed: both previews."""
    return EventSpec(
        EventKind.VERIFICATION,
        {
            "decision": "approval",
            "verdict": "preview_changed",
            "call_id": call.id,
            "name": call.name,
            "approved_preview": approved.to_json(),
            "fresh_preview": fresh.to_json() if fresh is not None else None,
            "message": "what this write would change is not what was approved: it did not run, "
            "and it waits for approval again",
        },
    )
