"""The admin's versions (agentruns.admin_versions): listed read-only on the configuration's page
and their own, the diff of two escaped, the view permission checked on every request."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import ConfigurationVersion
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory

pytestmark = pytest.mark.django_db

HOSTILE = '</pre><script>alert("v")</script>'


def two_versions():
    configuration = AgentConfigurationFactory(slug="diffed", system_prompt="before")
    configuration.system_prompt = HOSTILE
    configuration.save()
    old, new = configuration.versions.order_by("number")
    return configuration, old, new


def diff(old, new) -> str:
    return f"{reverse('admin:agentruns_configurationversion_diff')}?a={old.pk}&b={new.pk}"


def test_the_diff_shows_what_changed_escaped(admin_client):
    _, old, new = two_versions()
    page = admin_client.get(diff(old, new)).content.decode()
    assert '<span class="lh-diff-removed">-  &quot;system_prompt&quot;: &quot;before&quot;,' in page
    assert "&lt;script&gt;alert" in page and "<script>alert" not in page
    assert "diffed v1" in page and "diffed v2" in page


def test_the_configuration_page_lists_its_versions_with_links_to_their_diffs(admin_client):
    configuration, old, new = two_versions()
    url = reverse("admin:agentruns_agentconfiguration_change", args=[configuration.pk])
    page = admin_client.get(url).content.decode()
    assert "diff v1 → v2" in page and "the whole version" in page
    assert diff(old, new).replace("&", "&amp;") in page


def test_versions_are_read_only(admin_client):
    _, old, _ = two_versions()
    change = reverse("admin:agentruns_configurationversion_change", args=[old.pk])
    assert admin_client.get(change).status_code == 200
    delete = reverse("admin:agentruns_configurationversion_delete", args=[old.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert ConfigurationVersion.objects.filter(pk=old.pk).exists()


def test_the_diff_needs_staff_and_the_view_permission(client):
    _, old, new = two_versions()
    url = diff(old, new)
    client.force_login(UserFactory(username="outsider", is_staff=False))
    assert client.get(url).status_code == 302  # the admin's login page: not staff
    staff = UserFactory(username="staff")  # staff (the factory's default), no permission
    client.force_login(staff)
    assert client.get(url).status_code == 403
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(Permission.objects.get(codename="view_configurationversion"))
    client.force_login(staff)
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("query", ["a=1&b=", "a=x&b=1", "b=999999", "a=999999&b=1"])
def test_a_malformed_or_unknown_id_is_not_found(admin_client, query):
    two_versions()
    url = f"{reverse('admin:agentruns_configurationversion_diff')}?{query}"
    assert admin_client.get(url).status_code == 404
