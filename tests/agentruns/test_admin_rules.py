"""Standing approvals in the admin (``agentruns/admin_rules.py``): made through the service's
checks as the signed-in user, revoked by an action, never edited or deleted; deciders only."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agentruns.models import ApprovalRule, ApprovalRuleEvent
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.rules import make_rule

pytestmark = pytest.mark.django_db

DECIDE = "agentruns.decide_agentrun"
ADD = reverse("admin:agentruns_approvalrule_add")
LIST = reverse("admin:agentruns_approvalrule_changelist")


@pytest.fixture
def notes():
    return AgentConfigurationFactory(slug="notes", tools=["create_note", "call_webhook"])


def form(configuration, **overrides):
    return {
        "configuration": configuration.pk,
        "tool": "create_note",
        "arguments_schema": json.dumps({"properties": {"title": {"const": "t"}}}),
        "expires_at_0": (timezone.now() + timedelta(days=2)).strftime("%Y-%m-%d"),
        "expires_at_1": "12:00:00",
        "max_uses": "3",
        **overrides,
    }


def test_a_decider_makes_a_rule_in_their_name(client, notes):
    alice = UserFactory(username="alice", permissions=[DECIDE])
    client.force_login(alice)

    response = client.post(ADD, form(notes))

    assert response.status_code == 302, response.content.decode()[:2000]
    rule = ApprovalRule.objects.get()
    assert (rule.author, rule.tool, rule.max_uses) == (alice, "create_note", 3)
    assert list(ApprovalRuleEvent.objects.values_list("kind", flat=True)) == ["created"]


def test_the_form_shows_the_services_refusals(client, notes):
    client.force_login(UserFactory(username="bob", permissions=[DECIDE]))

    hostile = client.post(ADD, form(notes, arguments_schema=json.dumps({"pattern": "(?=x)"})))
    webhook = client.post(ADD, form(notes, tool="call_webhook"))

    assert hostile.status_code == 200 and "pattern" in hostile.content.decode()
    assert webhook.status_code == 200
    assert "playground.approve_webhooks" in webhook.content.decode()
    assert not ApprovalRule.objects.exists()


def test_the_revoke_action_revokes_and_nothing_is_edited_or_deleted(client, notes):
    alice = UserFactory(username="alice", permissions=[DECIDE])
    rule = make_rule(notes, tool="create_note", schema={}, by=alice)
    client.force_login(alice)

    client.post(LIST, {"action": "revoke", "_selected_action": [rule.pk]})

    rule.refresh_from_db()
    assert rule.revoked_at is not None
    change = reverse("admin:agentruns_approvalrule_change", args=[rule.pk])
    assert 'name="tool"' not in client.get(change).content.decode()  # read-only
    delete = reverse("admin:agentruns_approvalrule_delete", args=[rule.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert ApprovalRule.objects.filter(pk=rule.pk).exists()


def test_staff_who_may_not_decide_see_no_rules(client, notes):
    client.force_login(UserFactory(username="staff"))

    assert client.get(LIST).status_code == 403
    assert client.get(ADD).status_code == 403
