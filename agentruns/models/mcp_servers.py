"""``McpServer``: a remote tool server an operator registers (docs/design.md §4.5), with its
transport choices and the rule its name follows.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from agentruns.secrets import secret_env_problem


class McpTransport(models.TextChoices):
    STREAMABLE_HTTP = "streamable_http", "Streamable HTTP (a URL)"
    STDIO = "stdio", "stdio (a local command; only when AGENTRUNS['MCP_STDIO_ALLOWED'] is on)"


# A server name becomes part of every tool name ``mcp__<server>__<tool>`` (at most 64 characters,
# letters, digits, ``_`` and ``-``); ``__`` is the separator, so a name may neither contain it
# nor end with ``_``.
MCP_SERVER_NAME_RE = r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_|$))*$"
MCP_SERVER_NAME_MAX = 24


class McpServer(models.Model):
    """A remote tool server (MCP) registered by an operator. Edited in the admin (docs/design.md
    §4.5).

    Every tool it offers is a ``non_idempotent_write``, except those the operator lists in
    ``read_only_tools`` (reads: no approval, no fence); ``requires_approval`` is read
    fail-closed through ``approval_required``. Secrets never live here: ``headers_env`` names the
    environment variables that hold them (allowed names only, ``agentruns.secrets``).
    ``tools_snapshot`` and ``last_synced_at`` are written by ``agentruns.services.mcp_sync``
    (the ``sync_mcp_tools`` command, the admin action).
    """

    name = models.CharField(
        max_length=MCP_SERVER_NAME_MAX,
        unique=True,
        validators=[
            RegexValidator(
                MCP_SERVER_NAME_RE,
                "Letters, digits, '-' and single '_' only (tools are named mcp__<server>__<tool>).",
            )
        ],
        help_text="Tools appear as mcp__<name>__<tool>.",
    )
    transport = models.CharField(
        max_length=20, choices=McpTransport.choices, default=McpTransport.STREAMABLE_HTTP
    )
    url = models.URLField(
        max_length=500, blank=True, help_text="Streamable HTTP endpoint, e.g. http://host/mcp"
    )
    command = models.CharField(
        max_length=1000,
        blank=True,
        help_text="stdio: the command line that starts the server (split like a shell would).",
    )
    enabled = models.BooleanField(default=True)
    requires_approval = models.BooleanField(
        null=True,
        default=True,
        help_text=(
            "On (the default): every call of this server's tools waits for a staff decision. "
            "Only an explicit 'No' lets them run unattended, on the first pass of a run (still "
            "fenced). Unknown counts as on."
        ),
    )
    timeout_seconds = models.PositiveIntegerField(
        default=20,
        validators=[MinValueValidator(1)],
        help_text="Per call (connect + call); capped by AGENTRUNS['TOOL_TIMEOUT_SECONDS'].",
    )
    allowed_tools = models.JSONField(
        default=list,
        blank=True,
        help_text="The server's tool names this deployment may use; empty = all discovered.",
    )
    read_only_tools = models.JSONField(
        default=list,
        blank=True,
        help_text=(
            'Tools you declare read-only, e.g. ["git_status", "git_log"]: they run without '
            "approval and unfenced. Every other tool is a non-idempotent write. The server's own "
            "hints (readOnlyHint) never decide this."
        ),
    )
    headers_env = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            'HTTP headers from the environment: {"Authorization": "LEASEHOLD_MY_SERVER_AUTH"} '
            "sends the value of $LEASEHOLD_MY_SERVER_AUTH. Never put a secret here. Names start "
            "with an allowed prefix (AGENTRUNS['SECRET_ENV_PREFIXES'], by default LEASEHOLD_)."
        ),
    )
    tools_snapshot = models.JSONField(
        default=list,
        blank=True,
        help_text="Discovered tools: name, registered_name, description, input_schema, hints.",
    )
    last_synced_at = models.DateTimeField(null=True, blank=True)
    last_sync_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name

    @property
    def approval_required(self) -> bool:
        """Fail closed: only an explicit ``False`` switches approval off."""
        return self.requires_approval is not False

    def clean(self) -> None:
        errors: dict[str, str] = {}
        self._check_transport(errors)
        for name in ("allowed_tools", "read_only_tools"):
            if not _tool_names(getattr(self, name)):
                errors[name] = "A JSON list of tool names."
        if (problem := _headers_env_problem(self.headers_env)) is not None:
            errors["headers_env"] = problem
        if errors:
            raise ValidationError(errors)

    def _check_transport(self, errors: dict[str, str]) -> None:
        """A URL for HTTP; for stdio, stdio allowed and a command."""
        from agentruns.conf import app_settings

        if self.transport == McpTransport.STREAMABLE_HTTP:
            if not self.url:
                errors["url"] = "A streamable HTTP server needs a URL."
        elif self.transport == McpTransport.STDIO:
            if not app_settings().mcp_stdio_allowed:
                errors["transport"] = "stdio servers are off (AGENTRUNS['MCP_STDIO_ALLOWED'])."
            elif not self.command.strip():
                errors["command"] = "A stdio server needs a command."
        else:
            errors["transport"] = f"Unknown transport {self.transport!r}."


def _tool_names(value: Any) -> bool:
    """A JSON list of non-empty tool names."""
    return isinstance(value, list) and all(isinstance(t, str) and t for t in value)


_HEADER_NAME = r"[A-Za-z0-9!#$%&'*+.^_`|~-]+"
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def _headers_env_problem(value: Any) -> str | None:
    """What is wrong with ``headers_env`` (a header name → the name of the environment variable
    holding its value), or ``None``."""
    if not isinstance(value, dict) or not all(
        isinstance(h, str)
        and re.fullmatch(_HEADER_NAME, h)
        and isinstance(v, str)
        and re.fullmatch(_ENV_NAME, v)
        for h, v in value.items()
    ):
        return (
            'A JSON object {"Header-Name": "ENV_VAR_NAME"}: the name of an environment '
            "variable, never the secret itself."
        )
    refused = [
        f"{header}: {problem}"
        for header, variable in value.items()
        if (problem := secret_env_problem(variable)) is not None
    ]
    return " ".join(refused) if refused else None
