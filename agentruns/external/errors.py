"""The refusals of ``agentruns.external``: each a ``LeaseholdError`` with a stable ``code``."""

from __future__ import annotations

from typing import Any

from agentruns.exceptions import LeaseholdError, WriteWithoutDurableExecution


class LeaseLost(WriteWithoutDurableExecution):
    """The run's lease was lost (taken over, reclaimed by the reaper, or the run settled): nothing
    more is written or run under it."""

    code = "lease_lost"
    status = 409


class RunCancelled(LeaseLost):
    """The run was cancelled: nothing more is written or run under its lease."""

    code = "run_cancelled"


class RunPaused(LeaseholdError):
    """The run waits for a person (approval, input or reconciliation): pause the framework and
    resume it once the run is queued again (``external.resumable``)."""

    code = "run_paused"
    status = 409

    def __init__(self, message: str | None = None, *, card: Any = None, **detail: Any) -> None:
        super().__init__(message, **detail)
        self.card = card


class NotHoldable(LeaseholdError):
    """There is no queued run of this framework to claim under that id: it waits for a person,
    another loop holds it, it ended, or Leasehold's own loop drives it."""

    code = "not_holdable"
    status = 409


class StateTooLarge(LeaseholdError):
    """The framework state is larger than AGENTRUNS["EXTERNAL_STATE_MAX_BYTES"] allows."""

    code = "external_state_too_large"
    status = 413


class StateNotStorable(LeaseholdError):
    """The framework state is not JSON a column can store."""

    code = "external_state_not_storable"
    status = 422


class InvalidFramework(LeaseholdError):
    """A framework's name is 1 to 64 characters of a-z, 0-9, '.', '_' and '-'."""

    code = "invalid_framework"
    status = 400
