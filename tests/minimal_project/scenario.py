"""What a project that adds Leasehold does first. Run as
``python -m tests.minimal_project.scenario`` with ``DJANGO_SETTINGS_MODULE`` set to
``tests.minimal_project.settings`` and ``MINIMAL_PROJECT_DB`` to a SQLite file.

Checks, migrates, schedules the reaper, runs two scripted agents through the services (one
completes, one waits for approval of the project's own write tool and completes once approved),
renders the inbox for a superuser, and proves that none of it imported the host project
(``config``), the playground or DRF. Prints ``scenario passed`` at the end; any failure raises.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import django

FORBIDDEN = ("config", "playground", "rest_framework", "drf_spectacular")


def main() -> None:
    django.setup()
    from django.core.management import call_command

    call_command("check", fail_level="WARNING")
    call_command("migrate", verbosity=0)
    call_command("makemigrations", "agentruns", "approvals", check=True, dry_run=True, verbosity=0)
    call_command("setup_schedules", stdout=io.StringIO())

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django_q.models import Schedule

    from agentruns.models import AgentConfiguration, Effect, Provider, Status
    from agentruns.services import runs
    from agentruns.tools import Tool, registry

    assert Schedule.objects.filter(func="agentruns.tasks.reap_stale_runs").exists()

    filed: list[dict[str, Any]] = []
    registry.register(
        Tool(
            name="file_ticket",
            description="File a ticket in the host project's tracker.",
            parameters={
                "type": "object",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
            },
            effect=Effect.NON_IDEMPOTENT_WRITE,
            func=lambda context, arguments: filed.append(arguments) or {"ticket": len(filed)},
        )
    )

    hello = AgentConfiguration.objects.create(
        slug="hello", name="Hello", provider=Provider.SCRIPTED, script=[{"content": "done"}]
    )
    result = runs.run_start_sync(configuration=hello, prompt="say done")
    assert result.run.status == Status.COMPLETED, (result.outcome, result.detail)
    assert result.run.output == "done"

    ticketing = AgentConfiguration.objects.create(
        slug="ticketing",
        name="Ticketing",
        provider=Provider.SCRIPTED,
        script=[
            {"tool_calls": [{"name": "file_ticket", "arguments": {"title": "printer on fire"}}]},
            {"content": "filed"},
        ],
    )
    waiting = runs.run_start_sync(configuration=ticketing, prompt="file it")
    assert waiting.run.status == Status.WAITING_FOR_APPROVAL, (waiting.outcome, waiting.detail)
    assert filed == []

    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client = Client()
    client.force_login(admin)
    inbox = client.get("/admin/approvals/")
    assert inbox.status_code == 200, inbox.status_code
    page = inbox.content.decode()
    assert "Approvals inbox" in page and "file_ticket" in page and "printer on fire" in page
    detail = client.get(f"/admin/approvals/runs/{waiting.run.uuid}/")
    assert detail.status_code == 200, detail.status_code
    index = client.get("/admin/")
    assert index.status_code == 200 and 'id="approvals-link"' in index.content.decode()

    run = waiting.run
    run.refresh_from_db()
    approved = runs.run_decide(
        run_uuid=run.uuid,
        actor=admin,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="inline",
    )
    assert approved.run.status == Status.COMPLETED, (approved.outcome, approved.detail)
    assert approved.run.output == "filed" and filed == [{"title": "printer on fire"}]

    imported = [name for name in FORBIDDEN if name in sys.modules]
    assert not imported, f"imported by agentruns/approvals: {imported}"
    print("scenario passed")


if __name__ == "__main__":
    main()
