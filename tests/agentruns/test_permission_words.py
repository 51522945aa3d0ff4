"""Permissions in words (``agentruns.permission_words``): a refusal names each missing
permission by the name it is granted under and the groups that hold it, on the pages that
refuse (the inbox card, the playground, the cancel pages)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from agentruns.authority import approval_authority, cancel_authority, start_authority
from agentruns.permission_words import authority_permissions, permissions_in_words
from agentruns.templatetags.leasehold import permissions_in_words as tag
from agentruns.tools.shown import shown_turn
from agentruns.turns import read_pending_turn
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import WEBHOOK_SCRIPT, waiting_for_approval

pytestmark = pytest.mark.django_db

WEBHOOKS = "playground.approve_webhooks"


def _grant(group: str, permission: str) -> None:
    app_label, codename = permission.split(".")
    Group.objects.get_or_create(name=group)[0].permissions.add(
        Permission.objects.get(content_type__app_label=app_label, codename=codename)
    )


def test_a_permission_is_named_with_the_groups_that_hold_it() -> None:
    _grant("Release managers", WEBHOOKS)
    _grant("On call", WEBHOOKS)
    [words] = permissions_in_words([WEBHOOKS])
    assert words.name == "Can approve calls of call_webhook"
    assert words.groups == ("On call", "Release managers")
    assert words.sentence() == (
        "“Can approve calls of call_webhook” (playground.approve_webhooks) is held by the "
        "groups “On call”, “Release managers”, and by every superuser."
    )


def test_a_permission_no_group_holds_says_so_and_an_unknown_one_keeps_its_codename() -> None:
    held, unknown = permissions_in_words([WEBHOOKS, "nowhere.nothing"])
    assert held.groups == () and "is held by no group" in held.sentence()
    assert unknown.name == "" and unknown.sentence().startswith("nowhere.nothing is held")


def test_an_approval_refusal_names_what_the_reviewer_lacks_in_words() -> None:
    _grant("Release managers", WEBHOOKS)
    reviewer = UserFactory(permissions=["agentruns.decide_agentrun"])
    run = waiting_for_approval(script=WEBHOOK_SCRIPT, slug="hooks")
    authority = approval_authority(
        user=reviewer,
        configuration=run.configuration,
        pending=shown_turn(run, read_pending_turn(run)),
    )
    assert [w.permission for w in authority_permissions(authority)] == [WEBHOOKS]
    html = tag(authority)
    assert "Can approve calls of call_webhook" in html and "“Release managers”" in html
    assert html.startswith('<ul class="lh-permissions">')


def test_nothing_is_shown_when_nothing_is_missing() -> None:
    boss = UserFactory(is_superuser=True)
    assert authority_permissions(start_authority(boss)) == []
    assert tag(start_authority(boss)) == ""
    assert tag(None) == ""


def test_cancel_and_start_refusals_name_their_permissions() -> None:
    nobody = UserFactory()
    cancel = cancel_authority(nobody, initiator_id=None, in_doubt=True)
    assert [w.name for w in authority_permissions(cancel)] == [
        "Can cancel agent runs someone else started",
        "Can decide pending agent runs (approve, deny, input, reconcile)",
    ]
    assert [w.name for w in authority_permissions(start_authority(nobody))] == [
        "Can start agent runs (the API, the playground)"
    ]
