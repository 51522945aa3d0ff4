"""Making and revoking standing approvals (``services/approval_rules.py``): the checks, the
audit written with each change, and who may revoke. The API's answers are
``tests/agentruns/api/test_rule_views.py``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.exceptions import InvalidRequest, NotPermitted, RuleNotFound
from agentruns.models import ApprovalRule
from agentruns.services.approval_rules import (
    MAX_RULE_DAYS,
    approval_rule_check,
    approval_rule_create,
    approval_rule_revoke,
)
from tests.agentruns.support.rules import ONLY_OK, audit, author
from tests.agentruns.support.runtime import config

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("probes")]


def test_a_check_writes_nothing_and_a_create_writes_the_rule_with_its_event():
    configuration = config()
    alice = author(username="alice")
    expiry = timezone.now() + timedelta(days=MAX_RULE_DAYS - 1)
    fields = dict(
        configuration=configuration.slug,
        tool="probe_write",
        arguments_schema=ONLY_OK,
        expires_at=expiry,
        max_uses=3,
    )

    unsaved, authority = approval_rule_check(actor=alice, **fields)
    assert unsaved.pk is None and not ApprovalRule.objects.exists()
    assert authority.allowed

    rule = approval_rule_create(actor=alice, **fields)
    assert (rule.author, rule.uses, rule.max_uses) == (alice, 0, 3)
    assert audit(rule) == ["created"]
    created = rule.events.get()
    assert created.actor_ref == "alice"
    assert created.payload["arguments_schema"] == ONLY_OK


def test_an_expiry_more_than_thirty_days_away_is_refused():
    with pytest.raises(InvalidRequest) as refused:
        approval_rule_create(
            actor=author(),
            configuration=config().slug,
            tool="probe_write",
            arguments_schema={},
            expires_at=timezone.now() + timedelta(days=MAX_RULE_DAYS, minutes=1),
        )
    assert refused.value.detail["field"] == "expires_at"


def test_only_the_author_or_someone_with_the_authority_revokes():
    configuration = config()
    alice = author()
    rule = approval_rule_create(
        actor=alice,
        configuration=configuration.slug,
        tool="probe_write",
        arguments_schema={},
        expires_at=timezone.now() + timedelta(days=1),
    )
    from tests.agentruns.factories import UserFactory

    with pytest.raises(NotPermitted):
        approval_rule_revoke(actor=UserFactory(), rule_uuid=rule.uuid)
    approval_rule_revoke(actor=author(), rule_uuid=rule.uuid)  # another decider: may
    approval_rule_revoke(actor=alice, rule_uuid=rule.uuid)  # revoked already: nothing more

    assert audit(rule) == ["created", "revoked"]
    with pytest.raises(RuleNotFound):
        approval_rule_revoke(actor=alice, rule_uuid="nope")


def _flag(configuration) -> bool:
    configuration.refresh_from_db(fields=["has_standing_rules"])
    return configuration.has_standing_rules


def test_the_configuration_is_flagged_while_an_unrevoked_rule_exists():
    configuration = config()
    alice = author()
    assert not _flag(configuration)

    def make() -> ApprovalRule:
        return approval_rule_create(
            actor=alice,
            configuration=configuration.slug,
            tool="probe_write",
            arguments_schema={},
            expires_at=timezone.now() + timedelta(days=1),
        )

    first, second = make(), make()
    assert _flag(configuration)
    approval_rule_revoke(actor=alice, rule_uuid=first.uuid)
    assert _flag(configuration)  # the second still stands
    approval_rule_revoke(actor=alice, rule_uuid=second.uuid)
    assert not _flag(configuration)


@pytest.mark.parametrize(
    "schema",
    [{"properties": {"value": {"const": "a\x00b"}}}, {"const": float("nan")}, {"\ud800": {}}],
    ids=["nul", "nan", "lone-surrogate"],
)
def test_a_schema_the_database_cannot_store_is_refused_naming_the_field(schema):
    configuration = config()
    with pytest.raises(InvalidRequest) as refused:
        approval_rule_create(
            actor=author(),
            configuration=configuration.slug,
            tool="probe_write",
            arguments_schema=schema,
            expires_at=timezone.now() + timedelta(days=1),
        )
    assert refused.value.detail["field"] == "arguments_schema"
    assert not ApprovalRule.objects.exists()
