"""Opening, claiming and finding the runs an external agent loop drives (docs/external.md)."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from agentruns import transitions
from agentruns.exceptions import ConfigurationNotFound
from agentruns.external import _calls
from agentruns.external.errors import InvalidFramework, NotHoldable
from agentruns.external.holding import Holding, checked_state
from agentruns.external.values import CallOutcome, ProposedCall
from agentruns.identity import execution_identity
from agentruns.models import AgentConfiguration, AgentRun, Status, TerminationReason
from agentruns.services._common import User, user_id
from agentruns.services.runs import build_request
from agentruns.tools import Tool, registry
from agentruns.turns import LoopState, Unreadable

FRAMEWORK_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def checked_framework(framework: str) -> str:
    if not isinstance(framework, str) or not FRAMEWORK_RE.match(framework):
        raise InvalidFramework()
    return framework


def identity_of(framework: str) -> str:
    """The ``claimed_by`` of a holding: ``external-<framework>:<host>:<pid>``."""
    return execution_identity(f"external-{framework}")


def _configuration(configuration: AgentConfiguration | str) -> AgentConfiguration:
    if isinstance(configuration, AgentConfiguration):
        if not configuration.is_active:
            raise ConfigurationNotFound(f"configuration {configuration.slug!r} is not active")
        return configuration
    try:
        return AgentConfiguration.objects.get(slug=configuration, is_active=True)
    except AgentConfiguration.DoesNotExist:
        raise ConfigurationNotFound(f"no active configuration {configuration!r}") from None


def open_run(
    *,
    configuration: AgentConfiguration | str,
    prompt: str,
    framework: str,
    initiator: User | None = None,
    state: Any = None,
) -> Holding:
    """Start a run driven by ``framework``'s agent loop, claimed at birth by this process, and
    return its holding (use it as a context manager). ``configuration``: the agent's tools,
    approver group, four-eyes, deadlines, notifications — as for a native run; its provider is
    never called. ``initiator``: who started it (four-eyes: they may deny, not approve).
    ``state``: the framework state to store now (a LangGraph thread id).

    Refused before anything is written: ``ConfigurationNotFound``, ``InvalidRequest`` (the
    prompt), ``InvalidFramework``, ``StateTooLarge``, ``StateNotStorable``."""
    config = _configuration(configuration)
    checked_framework(framework)
    if state is not None:
        checked_state(state)
    request = build_request(configuration=config, prompt=prompt, options=None)
    lease = transitions.run_start(
        configuration=config,
        initiator_id=user_id(initiator),
        prompt=prompt,
        request=request,
        identity=identity_of(framework),
        external_framework=framework,
        external_state=state,
    )
    run = AgentRun.objects.select_related("configuration").get(pk=lease.run_id)
    return Holding(lease=lease, run=run, loop=LoopState(), framework=framework)


def hold(run_uuid: UUID | str, *, framework: str) -> Holding:
    """Claim the queued run ``run_uuid`` that ``framework``'s loop drives (a compare-and-set:
    of concurrent claimers exactly one wins, epoch + 1) and return its holding, the decision
    made while it waited already applied (``Holding.decision``; denials and answers recorded,
    an approval bound to the digest of what will run). ``NotHoldable``: it is not queued for
    this framework (waiting for a person, held, ended, or another framework's or native)."""
    checked_framework(framework)
    claimed = transitions.run_claim_queued_row(
        run_uuid=run_uuid, identity=identity_of(framework), external_framework=framework
    )
    if claimed is None:
        status = AgentRun.objects.filter(uuid=str(run_uuid)).values_list("status", flat=True)
        raise NotHoldable(run_uuid=str(run_uuid), status=next(iter(status), None))
    run = claimed.run
    if "configuration" not in run._state.fields_cache:
        run.configuration = AgentConfiguration.objects.get(pk=run.configuration_id)
    try:
        loop = LoopState.parse(run.loop_state)
    except Unreadable:
        loop = None
    holding = Holding(lease=claimed.lease, run=run, loop=loop or LoopState(), framework=framework)
    if loop is None:
        holding.settle_failed(
            TerminationReason.NOT_RESUMABLE, "NotRehydratable", "its loop state cannot be read"
        )
        raise NotHoldable("its stored state cannot be read: the run failed", run_uuid=str(run_uuid))
    holding.apply_decision()
    return holding


def resumable(*, framework: str, limit: int = 100) -> list[UUID]:
    """The runs ``framework``'s loop may claim now (queued: decided, reconciled, released or
    reclaimed by the reaper), oldest first."""
    checked_framework(framework)
    runs = AgentRun.objects.filter(
        status=Status.QUEUED, external_framework=framework, claimed_by=""
    ).order_by("updated_at", "pk")
    return list(runs.values_list("uuid", flat=True)[:limit])


def stored_state(run_uuid: UUID | str) -> Any:
    """The framework state stored with the run, read without holding it (``None``: none)."""
    return (
        AgentRun.objects.filter(uuid=str(run_uuid)).values_list("external_state", flat=True).first()
    )


def recorded(run_uuid: UUID | str, call: ProposedCall) -> CallOutcome | None:
    """What the run recorded for ``call`` (same id, same arguments), read without holding it:
    how a replay of a thread whose run ended (or is held elsewhere) returns a call's result
    without running it. ``None``: not recorded — it must not run without a holding."""
    call = _calls.checked(call)
    row = AgentRun.objects.filter(uuid=str(run_uuid)).values("pk", "loop_state").first()
    if row is None:
        return None
    try:
        loop = LoopState.parse(row["loop_state"])
    except Unreadable:
        return None
    call_id, known = _calls.leasehold_id(loop, call)
    payload = _calls.recorded_payload(row["pk"], call_id) if known else None
    if payload is None:
        return None
    return _calls.outcome_of(payload, run_uuid=run_uuid, call_id=call_id, recorded=True)


def register(defined: Tool) -> Tool:
    """Register a tool made with ``tool`` (``agentruns.tools.tool``) in Leasehold's registry (a
    no-op when the same definition is registered already) and return it."""
    return registry.register(defined)
