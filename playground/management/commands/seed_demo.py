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

#: Where the *Webhook sender* posts unless told otherwise: the demo receiver ``scripts/serve``
#: runs (``manage.py demo_receiver``) on the web server's port + 1.
DEFAULT_WEBHOOK_URL = "http://127.0.0.1:8001/hooks/deployed"
WELCOME = {"title": "Welcome", "body": "Leasehold keeps writes honest."}
EDITED_WELCOME_BODY = "Leasehold keeps writes honest, and shows each change before it is made."


def _answers(**by_kind: str) -> dict[str, Any]:
    """A scripted turn that answers what happened to the previous turn's calls: one branch per
    result kind (``agentruns.tools.result_kinds``), the ``ok`` one last and for anything else."""
    ok = by_kind.pop("ok")
    branches: list[dict[str, Any]] = [
        {"when": kind, "content": text} for kind, text in by_kind.items()
    ]
    return {"branches": [*branches, {"content": ok}]}


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def demo_configurations(*, webhook_url: str, welcome_id: int) -> list[dict[str, Any]]:
    """The demo's configurations, the README's Notes assistant first (the playground offers them
    in this order). Each scripted answer after a call says what happened to it."""
    return [
        {
            "slug": "notes-assistant",
            "name": "Notes assistant (scripted)",
            "system_prompt": "You keep the team's notes tidy.",
            "script": [
                _call("list_notes"),
                _call("create_note", title="Stand-up", body="Ship the inbox."),
                _answers(
                    denied="I listed the notes; you denied creating the stand-up note, so I "
                    "created nothing.",
                    expired="I listed the notes; nobody approved the stand-up note in time, so "
                    "I created nothing.",
                    refused="I listed the notes; creating the stand-up note was refused, so "
                    "nothing was created.",
                    error="I listed the notes, but creating the stand-up note failed (its error "
                    "is in the trace).",
                    ok="I listed the notes and created the stand-up note.",
                ),
            ],
        },
        {
            "slug": "note-editor",
            "name": "Note editor (scripted; its card shows the note before and after)",
            "system_prompt": "You keep the team's notes tidy.",
            "script": [
                _call("read_note", id=welcome_id),
                _call("update_note", id=welcome_id, body=EDITED_WELCOME_BODY),
                _answers(
                    denied="You denied the edit, so the Welcome note is unchanged.",
                    expired="Nobody approved the edit in time, so the Welcome note is unchanged.",
                    refused="The edit was refused, so the Welcome note is unchanged.",
                    error="The edit failed (its error is in the trace), so the Welcome note is "
                    "unchanged.",
                    ok="I rewrote the body of the Welcome note.",
                ),
            ],
        },
        {
            "slug": "ask-a-human",
            "name": "Asks a human (scripted)",
            "script": [
                _call("ask_human", question="Which colour?"),
                _answers(
                    expired="Nobody answered in time, so I chose no colour.",
                    denied="Nobody answered, so I chose no colour.",
                    refused="The question was refused, so I chose no colour.",
                    error="The question could not be asked, so I chose no colour.",
                    ok="Thanks, noted.",
                ),
            ],
        },
        {
            "slug": "webhook-sender",
            "name": "Webhook sender (scripted; approving needs “Can approve calls of "
            "call_webhook”)",
            "script": [
                _call("call_webhook", url=webhook_url, payload={"event": "deployed"}),
                _answers(
                    denied="You denied the webhook, so I did not send it.",
                    expired="Nobody approved the webhook in time, so I did not send it.",
                    refused="The webhook was refused before anything was sent (its address is "
                    "not on the allowlist), so nothing was delivered.",
                    error="The webhook could not be delivered (its error is in the trace).",
                    ok="I sent the deployment webhook; the receiver's answer is in the trace.",
                ),
            ],
        },
        {
            "slug": "slow-reader",
            "name": "Slow reader (scripted; its lease's heartbeats show while it waits)",
            "script": [
                {**_call("wait", seconds=22), "delay": 1},
                {**_call("list_notes"), "delay": 1},
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
        parser.add_argument(
            "--webhook-url",
            default=DEFAULT_WEBHOOK_URL,
            help="Where the Webhook sender posts: the demo receiver scripts/serve runs "
            f"(default {DEFAULT_WEBHOOK_URL}); its host:port must be in "
            "AGENTRUNS_WEBHOOK_ALLOWLIST.",
        )

    def handle(self, *args: Any, force: bool = False, **options: Any) -> None:
        if not settings.DEBUG and not force:
            raise CommandError("seed_demo creates known passwords: run it only with DEBUG on")
        welcome = self._notes()
        configurations = demo_configurations(
            webhook_url=options.get("webhook_url") or DEFAULT_WEBHOOK_URL, welcome_id=welcome.pk
        )
        for spec in configurations:
            spec = dict(spec)
            slug = spec.pop("slug")
            AgentConfiguration.objects.update_or_create(slug=slug, defaults=spec)
        self._users()
        self.stdout.write(self.style.SUCCESS("demo data ready"))

    def _notes(self) -> Note:
        """The demo notes on a database without notes; the Welcome note (the Note editor's)
        made again if it was deleted."""
        if not Note.objects.exists():
            Note.objects.create(**WELCOME)
            Note.objects.create(title="Groceries", body="Milk, bread.")
        welcome = Note.objects.filter(title=WELCOME["title"]).order_by("pk").first()
        return welcome if welcome is not None else Note.objects.create(**WELCOME)

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
