"""Run services: start, enqueue, process queued, cancel, abandon. The decision services
(decide, submit input, reconcile) are in ``agentruns.services.decisions``, re-exported here.

Each takes keyword-only arguments and either returns the run's outcome or raises a typed
refusal (``agentruns.exceptions``) before anything changed (docs/design.md §11.1).
"""

from __future__ import annotations

import logging
from typing import Any, cast
from uuid import UUID

from agentruns import selectors, transitions
from agentruns.authority import (
    DECIDE_PERMISSION,
    Decider,
    cancel_authority,
    start_authority,
)
from agentruns.conf import app_settings
from agentruns.exceptions import (
    ConfigurationNotFound,
    InvalidRequest,
    NotPermitted,
)
from agentruns.identity import execution_identity
from agentruns.leases import EventSpec, Lease
from agentruns.models import (
    AgentConfiguration,
    AgentRun,
    Provider,
    Segment,
    Status,
)
from agentruns.providers.base import ProviderError
from agentruns.providers.scripted import validate_script
from agentruns.services import dispatch
from agentruns.services._common import ClaimHook, User, run_id_of, user_id
from agentruns.services.runtime import shutdown
from agentruns.services.runtime.results import EventObserver, SegmentResult
from agentruns.services.runtime.segment import continue_segment
from agentruns.storable import json_problem, text_problem
from agentruns.tools import registry

logger = logging.getLogger(__name__)

CANCEL_IN_DOUBT_REFUSAL = (
    f"cancelling a run in doubt needs {DECIDE_PERMISSION}, as abandoning it does"
)


# --- Starting --------------------------------------------------------------------------------


def run_authorize_start(*, actor: User | None) -> None:
    """Raise ``NotPermitted`` (naming ``agentruns.start_agentrun``) unless ``actor`` may start a
    run through Leasehold's own interfaces: the API's ``POST /api/runs/`` and the playground
    call it before ``run_start_sync`` / ``run_enqueue``. Those two services check nothing about
    their ``initiator``: a project's own code that starts runs decides who may."""
    authority = start_authority(actor)
    if not authority.allowed:
        raise NotPermitted(authority.refusal)


def _configuration(configuration: AgentConfiguration | str) -> AgentConfiguration:
    if isinstance(configuration, AgentConfiguration):
        if not configuration.is_active:
            raise ConfigurationNotFound(f"configuration {configuration.slug!r} is not active")
        return configuration
    try:
        return AgentConfiguration.objects.get(slug=configuration, is_active=True)
    except AgentConfiguration.DoesNotExist:
        raise ConfigurationNotFound(f"no active configuration {configuration!r}") from None


def build_request(
    *, configuration: AgentConfiguration, prompt: Any, options: dict[str, Any] | None
) -> dict[str, Any]:
    """The serialised request: everything any segment on any machine needs to run it. Refused
    (``InvalidRequest``) before anything is written: text or JSON no column can store
    (``agentruns.storable``), and a script the scripted provider would refuse."""
    _check_prompt(prompt)
    options = dict(options or {})
    unknown = set(options) - {"script", "tools", "system_prompt", "max_iterations"}
    if unknown:
        raise InvalidRequest(f"unknown options: {', '.join(sorted(unknown))}")
    request: dict[str, Any] = {"prompt": prompt}
    if options.get("script") is not None:
        request["script"] = _checked_script(configuration, options["script"])
    if options.get("tools") is not None:
        request["tools"] = _checked_tools(configuration, options["tools"])
    if options.get("system_prompt"):
        request["system_prompt"] = _checked_system_prompt(options["system_prompt"])
    if options.get("max_iterations") is not None:
        request["max_iterations"] = _checked_max_iterations(options["max_iterations"])
    return request


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt must be a non-empty string", field="prompt")
    if (problem := text_problem(prompt)) is not None:
        raise InvalidRequest(f"prompt holds {problem}", field="prompt")
    limit = app_settings().max_prompt_chars
    if len(prompt) > limit:
        raise InvalidRequest(
            f"prompt is {len(prompt)} characters; at most {limit} are accepted "
            "(AGENTRUNS_MAX_PROMPT_CHARS)",
            field="prompt",
        )


def _checked_script(configuration: AgentConfiguration, script: Any) -> list[dict[str, Any]]:
    if configuration.provider != Provider.SCRIPTED:
        raise InvalidRequest("a script is accepted only by the scripted provider", field="script")
    if not isinstance(script, list):
        raise InvalidRequest("script must be a list of turns", field="script")
    if (problem := json_problem(script)) is not None:
        raise InvalidRequest(f"script cannot be stored: {problem}", field="script")
    try:
        validate_script(script)
    except ProviderError as exc:
        raise InvalidRequest(str(exc), field="script") from None
    return script


def _checked_tools(configuration: AgentConfiguration, tools: Any) -> list[str]:
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise InvalidRequest("tools must be a list of tool names", field="tools")
    available = set(configuration.tools or [t.name for t in registry.all()])
    missing = [t for t in tools if t not in available]
    if missing:
        raise InvalidRequest(
            f"tools not available to this configuration: {', '.join(missing)}", field="tools"
        )
    return tools


def _checked_system_prompt(system_prompt: Any) -> str:
    if not isinstance(system_prompt, str):
        raise InvalidRequest("system_prompt must be a string", field="system_prompt")
    if (problem := text_problem(system_prompt)) is not None:
        raise InvalidRequest(f"system_prompt holds {problem}", field="system_prompt")
    return system_prompt


def _checked_max_iterations(cap: Any) -> int:
    limit = app_settings().max_iterations
    if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= limit:
        raise InvalidRequest(
            f"max_iterations must be an integer from 1 to {limit}", field="max_iterations"
        )
    return cap


def run_start_sync(
    *,
    configuration: AgentConfiguration | str,
    prompt: str,
    initiator: User | None = None,
    options: dict[str, Any] | None = None,
    observer: EventObserver | None = None,
    on_claim: ClaimHook | None = None,
) -> SegmentResult:
    """Start a run claimed at birth by this process and run it until it pauses or ends."""
    config = _configuration(configuration)
    request = build_request(configuration=config, prompt=prompt, options=options)
    lease = transitions.run_start(
        configuration=config,
        initiator_id=user_id(initiator),
        prompt=prompt,
        request=request,
        identity=execution_identity(Segment.INTERACTIVE),
    )
    if on_claim is not None:
        on_claim(lease)
    return continue_segment(lease, observer=_after_birth(observer))


def _after_birth(observer: EventObserver | None) -> EventObserver | None:
    """``observer``, first shown the run's claim at birth (committed with the run) with the
    segment's first event: a live trace shows what the stored trace shows, and an observer that
    raises does so inside the segment, which settles the run as for any other event."""
    if observer is None:
        return None
    pending = [transitions.birth_event()]

    def observe(spec: EventSpec) -> None:
        while pending:
            observer(pending.pop())
        observer(spec)

    return observe


def run_enqueue(
    *,
    configuration: AgentConfiguration | str,
    prompt: str,
    initiator: User | None = None,
    options: dict[str, Any] | None = None,
) -> AgentRun:
    """Insert a queued run and send its wake-up after commit."""
    config = _configuration(configuration)
    request = build_request(configuration=config, prompt=prompt, options=options)
    run = transitions.run_enqueue(
        configuration=config, initiator_id=user_id(initiator), prompt=prompt, request=request
    )
    dispatch.wake_after_commit(str(run.uuid))
    return run


def run_process_queued(*, run_uuid: UUID | str, reload_run: bool = True) -> SegmentResult | None:
    """The worker's segment: claim a queued run and continue it. ``None``: nothing to claim.

    ``reload_run=False`` (the django-q2 task, which reports only the outcome) spares the read at
    the segment's end: the result's ``run`` is then the row as the claim left it. The segment
    starts from the row, configuration and (on a first claim) events the claim handed back, and
    hands the run back if the worker is told to stop meanwhile (docs/design.md §10.2).

    A worker that is stopping claims nothing: it sends the task again for another worker (a
    task its cluster had already fetched) and returns ``None``.
    """
    if shutdown.requested():
        dispatch.wake_after_commit(str(run_uuid))
        return None
    claimed = transitions.run_claim_queued_row(
        run_uuid=run_uuid, identity=execution_identity(Segment.WORKER)
    )
    if claimed is None:
        return None
    return continue_segment(
        claimed.lease,
        retry=dispatch.schedule_retry,
        wake=dispatch.wake_with_commit,
        reload_run=reload_run,
        run=claimed.run,
        events=claimed.events,
    )


def run_cancel(*, run_uuid: UUID | str, actor: User | None = None, note: str = "") -> bool:
    """Cancel a non-terminal run; ``False`` when it was already terminal.

    ``actor=None`` is the server itself (``cancel_run``): it may cancel any run. A person
    (docs/design.md §12.1) must see the run (else ``RunNotFound``: it does not exist for them)
    and have started it or hold ``agentruns.cancel_agentrun``; cancelling a run in doubt
    (``waiting_for_reconciliation``) also needs ``agentruns.decide_agentrun``, as abandoning it
    does. Refused: ``NotPermitted``, naming what is missing. The in-doubt rule is part of the
    cancel's guard, so a run that goes in doubt after it was read is refused, not cancelled.
    """
    if actor is None:
        run_id = cast(int, run_id_of(run_uuid))  # not missing_ok: RunNotFound, never None
        return transitions.run_cancel(run_id=run_id, note=note)
    run = selectors.run_get(run_uuid=run_uuid, user=actor)
    person = Decider(actor)
    authority = cancel_authority(
        person,
        initiator_id=run.initiator_id,
        in_doubt=run.status == Status.WAITING_FOR_RECONCILIATION,
    )
    if not authority.allowed:
        raise NotPermitted(authority.missing[0])
    may_end_in_doubt = authority.may_decide
    if transitions.run_cancel(
        run_id=run.pk, actor_id=user_id(actor), note=note, in_doubt=may_end_in_doubt
    ):
        return True
    if (
        not may_end_in_doubt
        and AgentRun.objects.filter(pk=run.pk, status=Status.WAITING_FOR_RECONCILIATION).exists()
    ):
        raise NotPermitted(CANCEL_IN_DOUBT_REFUSAL)  # it went in doubt after it was read
    return False


def run_abandon(*, lease: Lease) -> bool:
    """Settle the run held by ``lease`` ``failed`` / ``abandoned``: its interactive client went
    away mid-stream (docs/design.md §3.7). The segment still running under ``lease`` loses it at its
    next boundary and stops. ``False``: nothing changed — the run already paused or ended, or a
    write is in flight (fenced): call again after the segment's next boundary."""
    return transitions.run_abandon(lease, note="client disconnected")


# The decision services live in ``agentruns.services.decisions``; callers may reach them here.
from agentruns.services.decisions import (  # noqa: E402
    RECONCILIATION_VERDICTS,
    run_decide,
    run_reconcile,
    run_submit_input,
    validate_values,
)

__all__ = [
    "RECONCILIATION_VERDICTS",
    "ClaimHook",
    "build_request",
    "run_abandon",
    "run_authorize_start",
    "run_cancel",
    "run_decide",
    "run_enqueue",
    "run_process_queued",
    "run_reconcile",
    "run_start_sync",
    "run_submit_input",
    "validate_values",
]
