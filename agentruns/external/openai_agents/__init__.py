"""Leasehold under the OpenAI Agents SDK (``pip install leasehold[agents]``; docs/external.md).

API summary::

    leasehold_tool(tool, *, effect, approve_permission=None, requires_approval=None, preview=None,
          check=None) -> FunctionTool
        An SDK function tool registered in Leasehold with its effect; its ``needs_approval``
        is the run's (writes wait for the inbox, reads pass) and its body runs through the run
        (lease, fence, idempotency key, in doubt on an unknown outcome, one ``tool`` event).
    call_context() -> agentruns.tools.ToolContext
        Inside a guarded body: the call's ``idempotency_key`` and ``fencing_token``.
    start(agent, *, configuration, prompt, initiator=None, run_config=None) -> Result
        Start a run and drive ``Runner.run`` under its lease until it completes or waits.
    resume(agent, run_uuid, *, run_config=None) -> Result
        Claim a queued run (decided, reconciled, reclaimed) and continue from its RunState.
    resume_all(agents, *, limit=100, run_config=None) -> list[Result]
        (``agents``: one agent or several, matched by the name stored with each run)
        A worker pass over every queued run of this framework.
    Result(run_uuid, outcome, output, card): outcome completed | waiting | lease_lost | failed

Every tool of the agent must be guarded and the agent must not hand off (``TypeError``).
``ScriptedTurns`` (``.scripted``) is a model for tests and examples that needs no network.
"""

from agentruns.external.openai_agents._loop import (
    COMPLETED,
    FAILED,
    FRAMEWORK,
    LEASE_LOST,
    WAITING,
    Result,
    StoredStateUnreadable,
    resume,
    resume_all,
    start,
)
from agentruns.external.openai_agents._tools import (
    NotUnderLeasehold,
    call_context,
    is_guarded,
    leasehold_tool,
)

__all__ = [
    "COMPLETED",
    "FAILED",
    "FRAMEWORK",
    "LEASE_LOST",
    "WAITING",
    "NotUnderLeasehold",
    "Result",
    "StoredStateUnreadable",
    "call_context",
    "is_guarded",
    "leasehold_tool",
    "resume",
    "resume_all",
    "start",
]
