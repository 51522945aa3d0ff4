"""The admin's run and event pages show only the runs their user may see (docs/design.md §12.1):
another's run is not listed and its pages answer 404, exactly as a run that does not exist."""

from __future__ import annotations

import warnings

import pytest
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import URLField
from django.test import override_settings
from django.urls import reverse
from django.utils.deprecation import RemovedInDjango60Warning

from agentruns.models import AgentConfiguration, AgentRunEvent, EventKind, McpServer
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory, UserFactory

pytestmark = pytest.mark.django_db

ADMIN_VIEW = ["agentruns.view_agentrun", "agentruns.view_agentrunevent"]


@pytest.fixture
def operator(db):
    """Staff who may open the admin's run pages, but see only their own runs."""
    return UserFactory(username="operator", permissions=ADMIN_VIEW)


@pytest.fixture
def runs(operator):
    mine = AgentRunFactory(initiator=operator, completed=True, prompt="mine")
    theirs = AgentRunFactory(initiator=UserFactory(username="other"), completed=True)
    for run in (mine, theirs):
        AgentRunEvent.objects.create(run=run, sequence=0, kind=EventKind.LEASE)
    return mine, theirs


def change(model: str, pk: int) -> str:
    return reverse(f"admin:agentruns_{model}_change", args=[pk])


def test_the_run_list_shows_only_one_s_own_runs(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    html = client.get(reverse("admin:agentruns_agentrun_changelist")).content.decode()
    assert str(mine.uuid) in html and str(theirs.uuid) not in html


def test_another_s_run_page_is_404_like_a_missing_one(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    assert client.get(change("agentrun", mine.pk)).status_code == 200
    assert client.get(change("agentrun", theirs.pk)).status_code == 404
    assert client.get(change("agentrun", 999_999)).status_code == 404


def test_events_of_another_s_run_are_not_listed_and_404(client, operator, runs):
    mine, theirs = runs
    client.force_login(operator)
    listed = client.get(reverse("admin:agentruns_agentrunevent_changelist")).context["cl"]
    assert [e.run_id for e in listed.result_list] == [mine.pk]
    their_event = AgentRunEvent.objects.get(run=theirs)
    assert client.get(change("agentrunevent", their_event.pk)).status_code == 404
    my_event = AgentRunEvent.objects.get(run=mine)
    assert client.get(change("agentrunevent", my_event.pk)).status_code == 200


@pytest.mark.parametrize("extra", [["agentruns.view_all_agentruns"], ["agentruns.decide_agentrun"]])
def test_viewers_and_deciders_see_every_run(client, runs, extra):
    _, theirs = runs
    client.force_login(UserFactory(username="watcher", permissions=ADMIN_VIEW + extra))
    assert client.get(change("agentrun", theirs.pk)).status_code == 200
    listed = client.get(reverse("admin:agentruns_agentrun_changelist")).context["cl"]
    assert listed.result_count == 2


def test_an_event_s_payload_is_shown_as_indented_json_with_real_line_breaks(client, operator):
    run = AgentRunFactory(initiator=operator)
    event = AgentRunEvent.objects.create(
        run=run, sequence=0, kind=EventKind.TOOL, payload={"name": "create_note", "ok": True}
    )
    client.force_login(operator)
    html = client.get(reverse("admin:agentruns_agentrunevent_change", args=[event.pk])).content
    assert (
        "<pre>{\n  &quot;name&quot;: &quot;create_note&quot;,\n  &quot;ok&quot;: true\n}</pre>"
        in html.decode()
    )


# --- URL fields: https is assumed, the allowlist still judges -----------------------------------


@pytest.mark.parametrize("model", [AgentConfiguration, McpServer])
def test_the_admins_url_fields_assume_https_without_django_s_deprecation_warning(rf, model):
    """Django 5.2 warns (``RemovedInDjango60Warning``) for a form ``URLField`` that does not say
    which scheme a URL typed without one gets; the admin says https (Django 6.0's default)."""
    request = rf.get("/")
    request.user = UserFactory(is_staff=True, is_superuser=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RemovedInDjango60Warning)
        form_class = admin.site._registry[model].get_form(request)
    url_fields = [
        name for name, field in form_class.base_fields.items() if isinstance(field, URLField)
    ]
    assert url_fields
    for name in url_fields:
        assert form_class.base_fields[name].clean("hooks.example/x") == "https://hooks.example/x"


def test_a_webhook_url_typed_without_a_scheme_is_https_and_must_be_allowlisted_as_such(rf):
    request = rf.get("/")
    request.user = UserFactory(is_staff=True, is_superuser=True)
    form_class = admin.site._registry[AgentConfiguration].get_form(request)
    url = form_class.base_fields["notify_webhook_url"].clean("hooks.example/leasehold")
    assert url == "https://hooks.example/leasehold"
    configuration = AgentConfigurationFactory.build(notify_webhook_url=url)
    agentruns = {**settings.AGENTRUNS, "WEBHOOK_ALLOWLIST": ["hooks.example"]}
    with override_settings(AGENTRUNS=agentruns):
        configuration.clean()  # the host on https's default port
    agentruns["WEBHOOK_ALLOWLIST"] = ["hooks.example:80"]  # http's port only
    with override_settings(AGENTRUNS=agentruns), pytest.raises(ValidationError) as refused:
        configuration.clean()
    assert "hooks.example:443" in refused.value.message_dict["notify_webhook_url"][0]
