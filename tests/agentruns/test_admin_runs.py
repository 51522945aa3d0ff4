"""The admin's run pages (``agentruns.admin_runs``): a list an operator reads at a glance and a
read-only run page that shows ids, counts and times as every Leasehold page does."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.agentruns.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(db):
    return UserFactory(username="operator", permissions=["agentruns.view_agentrun"])


def change(model: str, pk: int) -> str:
    return reverse(f"admin:agentruns_{model}_change", args=[pk])


def test_the_run_list_shows_what_an_operator_reads_first(client, operator):
    from tests.agentruns.support.api import waiting_for_approval

    run = waiting_for_approval(operator)
    client.force_login(operator)
    html = client.get(reverse("admin:agentruns_agentrun_changelist")).content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert columns == [
        "short_id",
        "status_shown",
        "configuration_shown",
        "initiator_shown",
        "age",
        "cost_shown",
        "waiting_for_shown",
    ]
    assert f'title="{run.uuid}" data-run-id="{run.uuid}">{str(run.uuid)[:8]}</code>' in html
    assert "waiting for approval" in html and "approval: create_note" in html
    assert f'<span title="{run.configuration.name}">{run.configuration.slug}</span>' in html
    assert html.count('class="lh-nav"') == 1


def test_a_run_s_page_is_read_only_with_its_whole_id_counts_and_our_time_format(client, operator):
    from tests.agentruns.support.api import waiting_for_approval

    run = waiting_for_approval(operator)
    client.force_login(operator)
    html = client.get(change("agentrun", run.pk)).content.decode()
    assert 'name="_save"' not in html and "_continue" not in html  # no Save
    assert str(run.uuid) in html
    # Counted as every screen counts them (``run_counts``): the waiting run's one round so far.
    assert re.search(r"<label>Rounds:</label>\s*<div class=\"readonly\">1</div>", html)
    local = run.created_at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"{local} UTC</time>" in html  # as every Leasehold page shows a time, zone named
    assert html.count('class="lh-nav"') == 1
