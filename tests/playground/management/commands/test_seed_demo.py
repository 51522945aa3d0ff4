"""``seed_demo`` (a playground command): demo configurations, notes and the two demo users."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from agentruns.models import AgentConfiguration
from playground.models import Note


@pytest.mark.django_db
def test_seed_demo_refuses_without_debug() -> None:
    with pytest.raises(CommandError):
        call_command("seed_demo", stdout=StringIO())
    assert not get_user_model().objects.exists()


@pytest.mark.django_db
def test_seed_demo_seeds_once_and_the_colleague_may_decide_and_play() -> None:
    for _ in range(2):  # idempotent
        call_command("seed_demo", "--force", stdout=StringIO())
    assert AgentConfiguration.objects.filter(slug="notes-assistant", is_active=True).exists()
    assert list(Note.objects.values_list("title", flat=True)) == ["Welcome", "Groceries"]
    users = get_user_model().objects
    assert users.get(username="admin").is_superuser
    colleague = users.get(username="colleague")
    assert colleague.is_staff and not colleague.is_superuser
    assert colleague.get_all_permissions() == {
        "agentruns.start_agentrun",
        "agentruns.decide_agentrun",
        "playground.use_playground",
    }
    # Only admin may approve webhooks: colleague can approve notes but not call_webhook.
    assert users.get(username="admin").has_perm("playground.approve_webhooks")
    assert not colleague.has_perm("playground.approve_webhooks")
    assert (
        AgentConfiguration.objects.get(slug="webhook-sender").script[0]["tool_calls"][0]["name"]
        == "call_webhook"
    )
