from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agentruns"
    verbose_name = "Agent runs"

    def ready(self) -> None:
        """Let the tool registry resolve remote (MCP) tools, and register the system checks.
        Idempotent."""
        from agentruns import system_checks  # noqa: F401  (registers its checks)
        from agentruns.tools import mcp

        mcp.install()
