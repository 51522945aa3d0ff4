"""``/api/approval-rules/`` (docs/standing_approvals.md): made by someone holding the tool's
approve authority, refused with a clear 400 for a hostile schema (never a hang), read, and
revoked by ``DELETE``; every change in the audit table."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentruns.models import ApprovalRule, ApprovalRuleEvent
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import DECIDE, client_for, config

pytestmark = pytest.mark.django_db

URL = "/api/approval-rules/"
WEBHOOK_PERMISSION = "playground.approve_webhooks"
DEPLOY = {"properties": {"url": {"const": "https://hooks.example/deploy"}}, "required": ["url"]}


def body(**overrides: Any) -> dict[str, Any]:
    return {
        "configuration": "hooks",
        "tool": "call_webhook",
        "arguments_schema": DEPLOY,
        "expires_at": (timezone.now() + timedelta(days=5)).isoformat(),
        "max_uses": 10,
        **overrides,
    }


@pytest.fixture
def hooks():
    return config("hooks", [{"content": "hi"}], tools=["call_webhook", "create_note"])


@pytest.fixture
def approver(hooks):
    return client_for(UserFactory(username="approver", permissions=[DECIDE, WEBHOOK_PERMISSION]))


def test_a_rule_is_made_read_and_revoked(approver):
    made = approver.post(URL, body(), format="json")

    assert made.status_code == 201, made.content
    rule = made.json()
    assert rule["author"] == "approver" and rule["active"] is True
    assert rule["arguments_schema"] == DEPLOY and rule["uses"] == 0
    assert approver.get(f"{URL}{rule['uuid']}/").json()["uuid"] == rule["uuid"]
    assert [r["uuid"] for r in approver.get(URL).json()] == [rule["uuid"]]
    assert [r["uuid"] for r in approver.get(f"{URL}?active=true").json()] == [rule["uuid"]]
    assert approver.get(f"{URL}?active=false").json() == []

    revoked = approver.delete(f"{URL}{rule['uuid']}/")

    assert revoked.status_code == 200
    assert revoked.json()["active"] is False and revoked.json()["revoked_by"] == "approver"
    assert approver.delete(f"{URL}{rule['uuid']}/").status_code == 200  # changes nothing
    assert [r["uuid"] for r in approver.get(f"{URL}?active=false").json()] == [rule["uuid"]]
    kinds = ApprovalRuleEvent.objects.order_by("id").values_list("kind", flat=True)
    assert list(kinds) == ["created", "revoked"]


def test_making_a_rule_needs_the_tools_approve_authority(hooks):
    decider_only = client_for(UserFactory(username="decider", permissions=[DECIDE]))

    refused = decider_only.post(URL, body(), format="json")

    assert refused.status_code == 403
    assert refused.json()["code"] == "not_permitted"
    assert WEBHOOK_PERMISSION in refused.json()["message"]
    assert not ApprovalRule.objects.exists()


def test_revoking_someone_elses_rule_needs_the_same_authority(approver, hooks):
    rule = approver.post(URL, body(), format="json").json()
    other = client_for(UserFactory(username="other", permissions=[DECIDE]))

    assert other.delete(f"{URL}{rule['uuid']}/").status_code == 403
    assert ApprovalRule.objects.get().revoked_at is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("configuration", "nope"),
        ("tool", "not_a_tool"),
        ("tool", "read_note"),  # registered, but the configuration does not offer it
        ("expires_at", "2001-01-01T00:00:00Z"),
        ("expires_at", (timezone.now() + timedelta(days=31)).isoformat()),
        ("max_uses", 0),
    ],
)
def test_what_cannot_be_a_rule_is_refused_naming_the_field(approver, field, value):
    refused = approver.post(URL, body(**{field: value}), format="json")

    assert refused.status_code == 400, refused.content
    assert field in str(refused.json())
    assert not ApprovalRule.objects.exists()


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"not": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"enum": ["x" * 1000] * 200}, "too large"),
        (_deep(80), "nested deeper"),
        ({"properties": {"url": {"pattern": "(?=a)b"}}}, "pattern"),
        ({"properties": {"url": {"pattern": "(a)\\1"}}}, "pattern"),
        ({"$ref": "https://example.com/schema.json"}, "only references inside"),
        ({"$ref": "#"}, "itself without end"),
        ({"type": 12}, "not a valid JSON schema"),
    ],
    ids=["huge", "deep", "lookahead", "backreference", "remote", "recursive", "invalid"],
)
def test_a_hostile_schema_is_a_clear_400(approver, schema, says):
    refused = approver.post(URL, body(arguments_schema=schema), format="json")

    assert refused.status_code == 400, refused.content
    answer = refused.json()
    assert answer["code"] == "invalid_request" and answer["field"] == "arguments_schema"
    assert says in answer["message"]


def test_a_catastrophic_pattern_for_a_backtracking_engine_is_linear_on_re2(approver):
    """``^(a+)+$`` backtracks exponentially on Python's ``re``; RE2 reads it once: the rule is
    accepted and matching a long hostile value completes."""
    from agentruns.services.standing_approvals import arguments_match

    schema = {"properties": {"url": {"pattern": "^(a+)+$"}}, "required": ["url"]}
    made = approver.post(URL, body(arguments_schema=schema), format="json")
    assert made.status_code == 201, made.content
    rule = ApprovalRule.objects.get()

    assert arguments_match(rule, {"url": "a" * 5000 + "!"}) is False
    assert arguments_match(rule, {"url": "a" * 5000}) is True


def test_reading_rules_needs_the_decide_permission(hooks):
    staff = client_for(UserFactory(username="staff"))

    assert staff.get(URL).status_code == 403
    assert client_for(UserFactory(username="d", permissions=[DECIDE])).get(URL).status_code == 200


def test_an_unknown_or_malformed_rule_is_404(approver):
    for uuid in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        assert approver.get(f"{URL}{uuid}/").status_code == 404
        assert approver.delete(f"{URL}{uuid}/").status_code == 404
