from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agentruns"
    verbose_name = "Agent runs"

    def ready(self) -> None:
        """Let the tool registry resolve remote (MCP) tools, register the system checks, and let a
        django-q2 cluster told to stop tell its workers (``services.runtime.shutdown``).
        Idempotent."""
        from agentruns import system_checks, trigger_checks  # noqa: F401  (register checks)
        from agentruns.external import checks  # noqa: F401  (registers its checks)
        from agentruns.services.runtime import shutdown
        from agentruns.tools import mcp_tools

        mcp_tools.install()
        shutdown.install()
