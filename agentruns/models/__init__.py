"""The tables of ``agentruns`` and their choices (docs/design.md §1), one module per idea:

- ``choices``: the run vocabulary (status, reason, effect, event kind, …) and its sets;
- ``configuration``: ``AgentConfiguration``;
- ``configuration_versions``: ``ConfigurationVersion``, the immutable versions a run pins;
- ``runs``: ``AgentRun`` and its append-only ``AgentRunEvent`` stream;
- ``mcp``: ``McpServer``, a registered remote tool server;
- ``bookkeeping``: ``Counter``, ``NotificationState``, ``SpendDay`` and ``SpendHold``;
- ``chat_accounts``: ``SlackUser``, a Slack user mapped to the account its buttons act as;
- ``triggers``: ``RunSchedule`` / ``ScheduledStart`` and ``EventSource`` / ``ReceivedEvent``;
- ``approval_rules``: ``ApprovalRule`` (standing approvals) and its audit ``ApprovalRuleEvent``.

Import from here (``from agentruns.models import AgentRun``): every name is re-exported.
Status, lease and fence columns are written only by ``agentruns.transitions``; nothing else may
``save()`` an existing run.
"""

# The tables are imported in the order the single-file module declared them, so that Django
# registers them in the same order (content types, permissions, dumpdata, flush).
# isort: off
from agentruns.models.choices import (
    DEADLINE_STATUSES,
    FINAL_TIMEOUT_ACTIONS,
    TERMINAL_STATUSES,
    WAITING_STATUSES,
    WRITE_EFFECTS,
    ApprovalTimeoutAction,
    Effect,
    EventKind,
    Provider,
    Segment,
    Status,
    TerminationReason,
)
from agentruns.models.configuration import AgentConfiguration
from agentruns.models.agent_runs import AgentRun, AgentRunEvent
from agentruns.models.mcp_servers import (
    MCP_SERVER_NAME_MAX,
    MCP_SERVER_NAME_RE,
    McpServer,
    McpTransport,
)
from agentruns.models.bookkeeping import (
    Counter,
    NotificationChannel,
    NotificationState,
    SpendDay,
    SpendHold,
    SpendScope,
)
from agentruns.models.chat_accounts import SlackUser
from agentruns.models.triggers import (
    EventAction,
    EventSource,
    ReceivedEvent,
    RunSchedule,
    ScheduledStart,
    ScheduleKind,
    StartOutcome,
)
from agentruns.models.approval_rules import ApprovalRule, ApprovalRuleEvent, RuleEventKind
from agentruns.models.configuration_versions import ConfigurationVersion
# isort: on

__all__ = [
    "DEADLINE_STATUSES",
    "FINAL_TIMEOUT_ACTIONS",
    "MCP_SERVER_NAME_MAX",
    "MCP_SERVER_NAME_RE",
    "TERMINAL_STATUSES",
    "WAITING_STATUSES",
    "WRITE_EFFECTS",
    "AgentConfiguration",
    "AgentRun",
    "AgentRunEvent",
    "ApprovalRule",
    "ApprovalRuleEvent",
    "ApprovalTimeoutAction",
    "ConfigurationVersion",
    "Counter",
    "Effect",
    "EventAction",
    "EventKind",
    "EventSource",
    "McpServer",
    "McpTransport",
    "NotificationChannel",
    "NotificationState",
    "Provider",
    "ReceivedEvent",
    "RuleEventKind",
    "RunSchedule",
    "ScheduleKind",
    "ScheduledStart",
    "Segment",
    "SlackUser",
    "SpendDay",
    "SpendHold",
    "SpendScope",
    "StartOutcome",
    "Status",
    "TerminationReason",
]
