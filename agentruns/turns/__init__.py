"""The run's JSON, typed: the stored turn, the pending turn, decisions and the loop state
(docs/design.md §1.4, §1.5).

A run keeps its progress in two JSON columns. ``loop_state`` is the segment's own record (the
round, the turn being executed, a human's decision waiting to be applied, the digests already
decided, token usage); ``pending_turn`` is what a waiting run shows a human (the calls to approve,
the call asking for input, the write in doubt) bound by a digest. This module is the only place
that builds, parses and serialises them, and the only place that computes a turn's digest:

* every value ``parse``\\ s itself from stored JSON, refusing malformed data with ``Unreadable``
  (its message says why, in words a person can read), and writes itself back with ``to_json``;
* ``read_pending_turn(run)`` is how every interface (runtime, inbox, playground, API) reads a
  waiting run: a turn whose shape, kind or digest does not agree reads as ``unreadable`` —
  shown without controls, the same way everywhere.

Free of queries: it looks at the values it is given, nothing else. What a card shows about each
call's tool (effect, description, server) is read from the registry by
``agentruns.tools.shown``, which digests the turn as shown with ``turn_digest``.
"""

from agentruns.turns.call_verdicts import (
    ANSWER,
    APPROVE,
    DENY,
    EDIT,
    MAX_ANSWER_CHARS,
    MAX_REASON_CHARS,
    MAX_VERDICT_DEPTH,
    VERDICTS,
    CallVerdict,
    VerdictName,
)
from agentruns.turns.calls import (
    APPROVAL,
    INPUT,
    RECONCILIATION,
    UNREADABLE,
    Call,
    CallEdit,
    PendingKind,
    Unreadable,
    argument_order,
    canonical_json,
    ordered_arguments,
    turn_digest,
)
from agentruns.turns.checks import CheckStatus
from agentruns.turns.origins import ServerOrigin, ToolOrigin
from agentruns.turns.pending import (
    PendingTurn,
    read_pending_turn,
    stored_digest,
    unreadable,
    waits_for_a_human,
)
from agentruns.turns.previews import Change, Preview
from agentruns.turns.state import (
    DEADLINE,
    DECIDED_DIGESTS_KEPT,
    ApprovalDecision,
    Decision,
    InputDecision,
    LoopState,
    ReconciliationDecision,
    Turn,
    Usage,
    decided_digests,
    parse_decision,
    with_decision,
)

__all__ = [
    "ANSWER",
    "APPROVAL",
    "APPROVE",
    "DEADLINE",
    "DECIDED_DIGESTS_KEPT",
    "DENY",
    "EDIT",
    "INPUT",
    "MAX_ANSWER_CHARS",
    "MAX_REASON_CHARS",
    "MAX_VERDICT_DEPTH",
    "RECONCILIATION",
    "UNREADABLE",
    "VERDICTS",
    "ApprovalDecision",
    "Call",
    "CallEdit",
    "CallVerdict",
    "Change",
    "CheckStatus",
    "Decision",
    "InputDecision",
    "LoopState",
    "PendingKind",
    "PendingTurn",
    "Preview",
    "ReconciliationDecision",
    "ServerOrigin",
    "ToolOrigin",
    "Turn",
    "Unreadable",
    "Usage",
    "VerdictName",
    "argument_order",
    "canonical_json",
    "decided_digests",
    "ordered_arguments",
    "parse_decision",
    "read_pending_turn",
    "stored_digest",
    "turn_digest",
    "unreadable",
    "waits_for_a_human",
    "with_decision",
]
