from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agentruns"
    verbose_name = "Agent runs"

    def ready(self) -> None:
        """Let the tool registry resolve remote (MCP) tools. Idempotent."""
        from agentruns.tools import mcp

        mcp.install()
