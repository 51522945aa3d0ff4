from django.apps import AppConfig


class PlaygroundConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "playground"
    verbose_name = "Playground"

    def ready(self) -> None:
        """Register the sample tools. Idempotent: ``ready()`` may run more than once."""
        from agentruns.tools import registry
        from playground.tools import TOOLS

        registry.register_all(TOOLS)
