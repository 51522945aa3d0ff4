"""The vocabulary of refusals.

One class per refusal, each with a stable ``code``, an HTTP ``status`` and its docstring as the
default message. ``config.api.exception_handler`` maps them to HTTP in exactly one place; the
inbox and playground turn them into messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentruns.tools.schemas import SchemaError


class LeaseholdError(Exception):
    """Leasehold refused the request."""

    code = "error"
    status = 400

    def __init__(self, message: str | None = None, **detail: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        self.detail = detail
        super().__init__(self.message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.detail}


class WriteWithoutDurableExecution(LeaseholdError):
    """A write tool was attempted by a segment that holds no lease on a persisted run."""

    code = "write_without_durable_execution"
    status = 409


class StateWriteFailed(LeaseholdError):
    """The database refused a state write; nothing was changed."""

    code = "state_write_failed"
    status = 503


class RunNotFound(LeaseholdError):
    """No such run."""

    code = "run_not_found"
    status = 404


class AmbiguousRunId(LeaseholdError):
    """More than one run starts with that id: give more of it."""

    code = "ambiguous_run_id"
    status = 400


class ConfigurationNotFound(LeaseholdError):
    """No active configuration with that slug."""

    code = "configuration_not_found"
    status = 400


class InvalidRequest(LeaseholdError):
    """The request is malformed."""

    code = "invalid_request"
    status = 400


class NotWaiting(LeaseholdError):
    """The run is not waiting for this decision anymore."""

    code = "not_waiting"
    status = 409


class AlreadyDecided(LeaseholdError):
    """Someone already decided this turn."""

    code = "already_decided"
    status = 409


class ApprovalExpired(LeaseholdError):
    """The approval deadline passed: the deadline settles this run, not a decision."""

    code = "approval_expired"
    status = 409


class StaleTurn(LeaseholdError):
    """The pending action changed — review again."""

    code = "stale_turn"
    status = 409


class SelfApprovalRefused(LeaseholdError):
    """A colleague must approve; you may deny."""

    code = "self_approval_refused"
    status = 403


class NotPermitted(LeaseholdError):
    """You do not have permission to do this."""

    code = "not_permitted"
    status = 403


class InvalidInput(LeaseholdError):
    """The submitted values do not match the input schema."""

    code = "invalid_input"
    status = 422

    def __init__(self, message: str | None = None, *, errors: Sequence[SchemaError] = ()) -> None:
        # ``errors`` typed for the forms; the detail carries them as JSON for every other reader.
        self.errors: tuple[SchemaError, ...] = tuple(errors)
        super().__init__(message, errors=[error.as_dict() for error in self.errors])


class CallsMismatch(LeaseholdError):
    """Name every open call of the turn exactly once."""

    code = "calls_mismatch"
    status = 400

    def __init__(
        self,
        message: str | None = None,
        *,
        missing: Sequence[str] = (),
        duplicated: Sequence[str] = (),
        unknown: Sequence[str] = (),
    ) -> None:
        super().__init__(
            message, missing=list(missing), duplicated=list(duplicated), unknown=list(unknown)
        )


class ValueTooLong(LeaseholdError):
    """A value is longer than allowed."""

    code = "value_too_long"
    status = 400

    def __init__(self, message: str | None = None, *, field: str, limit: int) -> None:
        super().__init__(message, field=field, limit=limit)


class InvalidArguments(LeaseholdError):
    """The edited arguments do not match the tool's schema."""

    code = "invalid_arguments"
    status = 422

    def __init__(
        self, message: str | None = None, *, call_id: str, errors: Sequence[SchemaError] = ()
    ) -> None:
        # ``errors`` typed for the forms; ``field`` names the first field at fault ("" for the
        # arguments as a whole), ``errors`` carries them all as JSON.
        self.errors: tuple[SchemaError, ...] = tuple(errors)
        first = self.errors[0].path if self.errors else ()
        super().__init__(
            message,
            call_id=call_id,
            field="/".join(str(part) for part in first),
            errors=[error.as_dict() for error in self.errors],
        )


class UnreadableState(LeaseholdError):
    """The run's stored state cannot be read."""

    code = "unreadable_state"
    status = 409


class SecretEnvRefused(LeaseholdError):
    """That environment variable may not hold a secret for Leasehold."""

    code = "secret_env_refused"
    status = 400


class LedgerKeyUnavailable(LeaseholdError):
    """The ledger's key (AGENTRUNS_LEDGER_KEY) cannot be read: no event can be chained."""

    code = "ledger_key_unavailable"
    status = 503


class ReviewLinkInvalid(LeaseholdError):
    """This review link is not valid: it was altered, or made for another run."""

    code = "review_link_invalid"
    status = 404


class ReviewLinkForAnotherAccount(LeaseholdError):
    """This review link was sent to another account: sign in as its recipient, or use the inbox."""

    code = "review_link_another_account"
    status = 403


class ReviewLinkExpired(LeaseholdError):
    """This review link has expired: open the run from the inbox."""

    code = "review_link_expired"
    status = 410


class ChatUserUnknown(LeaseholdError):
    """Your Slack account is not linked to a Leasehold account, so it decides nothing.

    An administrator links it in the admin or with ``manage.py slack_users link``."""

    def __init__(self, message: str | None = None, **detail: Any) -> None:
        super().__init__(
            message
            or "Your Slack account is not linked to a Leasehold account, so it decides nothing: "
            "ask an administrator to link it (manage.py slack_users link USERNAME SLACK_USER_ID).",
            **detail,
        )

    code = "chat_user_unknown"
    status = 403


class ChatApprovalRefused(LeaseholdError):
    """This turn cannot be approved from chat: open it and decide from its card."""

    code = "chat_approval_refused"
    status = 403


class EventSourceNotFound(LeaseholdError):
    """No configuration receives events at this address."""

    code = "event_source_not_found"
    status = 404


class BadSignature(LeaseholdError):
    """The event's signature or timestamp does not check out; nothing was read."""

    code = "bad_signature"
    status = 401


class EventTooLarge(LeaseholdError):
    """The event's body is too large; nothing was read."""

    code = "request_too_large"
    status = 413


class EventIdReused(LeaseholdError):
    """An event with this id but another body was received already; nothing changed."""

    code = "event_id_reused"
    status = 409


class CorrelationKeyTaken(LeaseholdError):
    """A run of this configuration was started with this correlation key already."""

    code = "correlation_key_taken"
    status = 409


class CorrelationKeyUnknown(LeaseholdError):
    """No run of this configuration was started with this correlation key."""

    code = "correlation_key_unknown"
    status = 404
