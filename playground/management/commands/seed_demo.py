"""Seed the local service with demo configurations, notes and users (idempotent)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from agentruns.models import AgentConfiguration, Provider
from playground.models import Note

# The staff user "colleague" may start and decide runs (agentruns) and use the playground
# (playground), but not approve webhooks (``playground.approve_webhooks``, call_webhook's
# approve_permission): of the demo users only the superuser "admin" holds that one (implicitly,
# as every permission).
COLLEAGUE_PERMISSIONS = Q(
    content_type__app_label="agentruns", codename__in=["start_agentrun", "decide_agentrun"]
) | Q(content_type__app_label="playground", codename="use_playground")

DEMO_CONFIGURATIONS: list[dict[str, Any]] = [
    {
        "slug": "notes-assistant",
        "name": "Notes assistant (scripted)",
        "system_prompt": "You keep the team's notes tidy.",
        "script": [
            {"tool_calls": [{"name": "list_notes", "arguments": {}}]},
            {
                "tool_calls": [
                    {
                        "name": "create_note",
                        "arguments": {"title": "Stand-up", "body": "Ship the inbox."},
                    }
                ]
            },
            {"content": "I listed the notes and created the stand-up note."},
        ],
    },
    {
        "slug": "ask-a-human",
        "name": "Asks a human (scripted)",
        "script": [
            {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
            {"content": "Thanks, noted."},
        ],
    },
    {
        "slug": "webhook-sender",
        "name": "Webhook sender (scripted; approving needs playground.approve_webhooks)",
        "script": [
            {
                "tool_calls": [
                    {
                        "name": "call_webhook",
                        "arguments": {
                            "url": "http://127.0.0.1:8000/hooks/deployed",
                            "payload": {"event": "deployed"},
                        },
                    }
                ]
            },
            {"content": "I sent the deployment webhook."},
        ],
    },
    {
        "slug": "slow-reader",
        "name": "Slow reader (scripted, shows heartbeats)",
        "script": [
            {"tool_calls": [{"name": "wait", "arguments": {"seconds": 5}}], "delay": 1},
            {"tool_calls": [{"name": "list_notes", "arguments": {}}], "delay": 1},
            {"content": "Done reading, slowly."},
        ],
    },
    {
        "slug": "local-openai",
        "name": "OpenAI-compatible endpoint (edit base URL and model)",
        "provider": Provider.OPENAI,
        "model": "llama3.1",
        "base_url": "http://127.0.0.1:11434/v1",
        "api_key_env": "LEASEHOLD_OPENAI_API_KEY",
        "is_active": False,
        "script": [],
    },
    {
        "slug": "anthropic",
        "name": "Anthropic Messages API (edit the model)",
        "provider": Provider.ANTHROPIC,
        "model": "claude-sonnet-4-5",
        "api_key_env": "LEASEHOLD_ANTHROPIC_API_KEY",
        "max_output_tokens": 4096,
        "is_active": False,
        "script": [],
    },
]


class Command(BaseCommand):
    help = "Create demo configurations, notes and local users. Idempotent; refuses without DEBUG."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--force", action="store_true", help="Seed even when DEBUG is off (not for production)."
        )

    def handle(self, *args: Any, force: bool = False, **options: Any) -> None:
        if not settings.DEBUG and not force:
            raise CommandError("seed_demo creates known passwords: run it only with DEBUG on")
        for spec in DEMO_CONFIGURATIONS:
            spec = dict(spec)
            slug = spec.pop("slug")
            AgentConfiguration.objects.update_or_create(slug=slug, defaults=spec)
        self._notes()
        self._users()
        self.stdout.write(self.style.SUCCESS("demo data ready"))

    def _notes(self) -> None:
        if not Note.objects.exists():
            Note.objects.create(title="Welcome", body="Leasehold keeps writes honest.")
            Note.objects.create(title="Groceries", body="Milk, bread.")

    def _users(self) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            user_model.objects.create_superuser("admin", "admin@example.com", "admin")
            self.stdout.write("created superuser admin / admin (local demo only)")
        if not user_model.objects.filter(username="colleague").exists():
            colleague = user_model.objects.create_user(
                "colleague", "colleague@example.com", "colleague", is_staff=True
            )
            colleague.user_permissions.add(*Permission.objects.filter(COLLEAGUE_PERMISSIONS))
            self.stdout.write(
                "created staff user colleague / colleague (may start, decide and play; may not "
                "approve webhooks)"
            )
