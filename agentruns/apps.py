from django.apps import AppConfig


class AgentrunsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agentruns"
    verbose_name = "Agent runs"
