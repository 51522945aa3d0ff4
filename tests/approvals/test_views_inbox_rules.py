"""The inbox lists the active standing approvals read-only (docs/standing_approvals.md): what
each matches, its author, expiry and uses; revoked, expired and used-up rules are not listed, and
a schema's text is escaped."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse

from agentruns.models import ApprovalRule
from agentruns.services.approval_rules import approval_rule_revoke
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.rules import make_rule

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")
DECIDE = "agentruns.decide_agentrun"


def test_the_inbox_lists_active_rules_read_only_and_escaped(client):
    alice = UserFactory(username="alice", permissions=[DECIDE])
    notes = AgentConfigurationFactory(name="Notes agent", tools=["create_note"])
    hostile = {"properties": {"title": {"const": "<script>alert(1)</script>"}}}
    active = make_rule(notes, tool="create_note", schema=hostile, by=alice, max_uses=5)
    revoked = make_rule(notes, tool="create_note", schema={"title": "revoked-one"}, by=alice)
    approval_rule_revoke(actor=alice, rule_uuid=revoked.uuid)
    expired = make_rule(notes, tool="create_note", schema={"title": "expired-one"}, by=alice)
    ApprovalRule.objects.filter(pk=expired.pk).update(expires_at=Now() - timedelta(seconds=1))
    client.force_login(alice)

    page = client.get(INBOX).content.decode()

    assert "Standing approvals" in page and "Notes agent" in page
    assert "0 of 5" in page and "alice" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "revoked-one" not in page and "expired-one" not in page
    assert "/revoke" not in page and str(active.uuid) not in page  # nothing to act on here


def test_no_active_rule_says_so(client):
    client.force_login(UserFactory(username="d", permissions=[DECIDE]))

    assert "No standing approval is active." in client.get(INBOX).content.decode()
