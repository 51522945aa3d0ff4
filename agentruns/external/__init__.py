"""Leasehold's leases, fences, inbox and ledger for an agent loop that is not Leasehold's own
(docs/external.md): LangGraph (``agentruns.external.langgraph``), the OpenAI Agents SDK, or any
loop that proposes tool calls and executes them.

API summary (stable: names are added, never renamed)
====================================================

Opening and claiming a run — each returns a ``Holding``, to use as a context manager::

    open_run(*, configuration, prompt, framework, initiator=None, state=None) -> Holding
        A new run driven by ``framework`` ("langgraph", "openai-agents": [a-z0-9._-]{1,64}),
        claimed at birth by this process. ``state``: JSON to store now (a thread id).
    hold(run_uuid, *, framework) -> Holding
        Claim a queued run of ``framework`` (compare-and-set, epoch + 1). The decision made
        while it waited is applied on the way (``Holding.decision``). ``NotHoldable`` else.
    resumable(*, framework, limit=100) -> list[UUID]
        Queued runs of ``framework`` (decided, reconciled, released, reclaimed), oldest first.
    stored_state(run_uuid) -> Any
        The framework state stored with a run, read without holding it.
    recorded(run_uuid, call) -> CallOutcome | None
        A call's recorded outcome, read without holding the run (a replay of an ended run).

``Holding`` (one stretch of work under the lease; the ticker renews it every LEASE_SECONDS/3
while the block runs; leaving the block releases the run to ``queued`` for its framework)::

    .run_uuid: str   .framework: str   .lease: Lease   .phase: held|paused|released|ended|lost
    .state -> Any                      the stored framework state
    .save_state(state)                 store JSON (<= AGENTRUNS["EXTERNAL_STATE_MAX_BYTES"]);
                                       also allowed right after this holding paused the run
    .decision -> dict | None           the decision applied at claim (ApprovalDecision /
                                       ReconciliationDecision .to_json()), for the resume value
    .propose(calls)                    record the model's calls as the run's turn (llm event)
    .needs_approval(call) -> bool      the call's turn waits for a person (whole turn rule)
    .verdict(call) -> Verdict          approved | undecided | denied | done (+ outcome)
    .recorded(call) -> CallOutcome|None  the recorded outcome of a call seen before
    .execute(call) -> CallOutcome      run one call through the run (fence, ticker, event)
    .run_turn(calls) -> list[CallOutcome]  propose and run a whole model answer
    .suspend(*, state=None) -> Card    save state, preview, wait for a decision in the inbox
    .complete(output="")               settle completed
    .fail(message)                     settle failed / external_failed
    .release()                         what leaving the block does
    .card -> Card | None               the card once paused

A call is ``ProposedCall(id, name, arguments)``: the framework's own call id, the tool's name in
Leasehold's registry, the arguments as proposed. The same id and arguments proposed again (a
replay, a fork, a resume) is the same call: its recorded ``CallOutcome`` is returned and nothing
runs (the key is the run, the call id and the arguments' digest). ``CallOutcome.message`` is what
the model reads (a result, a denial with the reviewer's reason, an operator's reconciliation).

Refusals (``agentruns.external.errors``, all ``LeaseholdError``): ``LeaseLost`` (a
``WriteWithoutDurableExecution``: the lease is gone, raised before anything more is written or
run), ``RunCancelled`` (a ``LeaseLost``), ``RunPaused`` (``.card``: the run waits for a person:
approval, input, or reconciliation after a write went in doubt), ``NotHoldable``,
``StateTooLarge``, ``StateNotStorable``, ``InvalidFramework``; ``InvalidRequest`` for a
malformed call.

Tools are Leasehold's own (``agentruns.tools.tool`` + ``registry.register``): their effect,
``approve_permission``, ``preview`` and ``check`` work for external runs exactly as for native
ones; ``tool`` and ``register`` are re-exported here.

The loop, in short::

    with external.open_run(configuration="notes", prompt=p, framework="mine") as run:
        try:
            outcomes = run.run_turn([ProposedCall(c.id, c.name, c.args) for c in calls])
        except RunPaused as paused:      # pause the framework; show paused.card
            ...
    # later, in a worker, once the inbox decided (or the reaper reclaimed it):
    for run_uuid in external.resumable(framework="mine"):
        with external.hold(run_uuid, framework="mine") as run:
            ...                          # resume the framework from run.state
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentruns.external.errors import (
        InvalidFramework,
        LeaseLost,
        NotHoldable,
        RunCancelled,
        RunPaused,
        StateNotStorable,
        StateTooLarge,
    )
    from agentruns.external.holding import Holding
    from agentruns.external.runs import hold, open_run, recorded, resumable, stored_state
    from agentruns.external.values import CallOutcome, Card, ProposedCall, Verdict
    from agentruns.tools import tool

# Loaded on first use (PEP 562), so that the app's ``ready()`` registering this package's system
# checks (``agentruns.external.checks``) loads neither the runtime nor the transitions.
_WHERE = {
    "InvalidFramework": "agentruns.external.errors",
    "LeaseLost": "agentruns.external.errors",
    "NotHoldable": "agentruns.external.errors",
    "RunCancelled": "agentruns.external.errors",
    "RunPaused": "agentruns.external.errors",
    "StateNotStorable": "agentruns.external.errors",
    "StateTooLarge": "agentruns.external.errors",
    "Holding": "agentruns.external.holding",
    "hold": "agentruns.external.runs",
    "open_run": "agentruns.external.runs",
    "recorded": "agentruns.external.runs",
    "resumable": "agentruns.external.runs",
    "stored_state": "agentruns.external.runs",
    "register": "agentruns.external.runs",
    "CallOutcome": "agentruns.external.values",
    "Card": "agentruns.external.values",
    "ProposedCall": "agentruns.external.values",
    "Verdict": "agentruns.external.values",
    "tool": "agentruns.tools",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'agentruns.external' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "CallOutcome",
    "Card",
    "Holding",
    "InvalidFramework",
    "LeaseLost",
    "NotHoldable",
    "ProposedCall",
    "RunCancelled",
    "RunPaused",
    "StateNotStorable",
    "StateTooLarge",
    "Verdict",
    "hold",
    "open_run",
    "recorded",
    "register",
    "resumable",
    "stored_state",
    "tool",
]
