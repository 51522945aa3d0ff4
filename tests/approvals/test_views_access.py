"""Who may use the inbox: staff with agentruns.decide_agentrun (superusers implicitly). Everyone
else gets the admin's normal refusal, a redirect to the admin login; the admin keeps working."""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from agentruns.models import AgentRunEvent, Status
from tests.agentruns.factories import UserFactory
from tests.approvals.conftest import start_waiting_run

pytestmark = pytest.mark.django_db

RUN = uuid.uuid4()
PAGES = [
    reverse("approvals:inbox"),
    reverse("approvals:recent"),
    reverse("approvals:run", args=[RUN]),
]
ACTIONS = [
    reverse("approvals:decide", args=[RUN]),
    reverse("approvals:input", args=[RUN]),
    reverse("approvals:reconcile", args=[RUN]),
]


def test_the_inbox_lives_inside_the_admin():
    assert reverse("approvals:inbox") == "/admin/approvals/"


def assert_sent_to_admin_login(response, path):
    assert response.status_code == 302
    login = reverse("admin:login")
    target = urlsplit(response["Location"])
    assert target.path == login
    assert parse_qs(target.query)["next"] == [path]


@pytest.mark.parametrize("path", PAGES)
def test_anonymous_visitors_are_sent_to_the_admin_login(client, path):
    assert_sent_to_admin_login(client.get(path), path)


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_staff_without_the_permission_are_sent_to_the_admin_login(client, path):
    client.force_login(UserFactory(username="plain-staff", is_staff=True))
    response = client.post(path) if path in ACTIONS else client.get(path)
    assert_sent_to_admin_login(response, path)


def test_non_staff_with_the_permission_are_sent_to_the_admin_login(client):
    user = UserFactory(is_staff=False, permissions=["agentruns.decide_agentrun"])
    client.force_login(user)
    assert_sent_to_admin_login(client.get(PAGES[0]), PAGES[0])


def test_a_refused_user_cannot_decide_by_posting(client, initiator):
    run = start_waiting_run(initiator=initiator)
    client.force_login(UserFactory(username="plain-staff", is_staff=True))
    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": run.pending_turn["turn_digest"]},
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
    assert not AgentRunEvent.objects.filter(run=run, kind="approval").exists()


@pytest.mark.parametrize("path", PAGES[:2])
def test_staff_with_the_permission_see_the_pages(client, decider, path):
    client.force_login(decider)
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("path", PAGES[:2])
def test_superusers_have_the_permission_implicitly(client, path):
    client.force_login(UserFactory(username="root", is_superuser=True))
    assert client.get(path).status_code == 200


def test_the_admin_index_links_to_the_inbox_for_deciders_only(client, decider):
    client.force_login(decider)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert f'href="{reverse("approvals:inbox")}"' in response.content.decode()

    client.force_login(UserFactory(username="plain-staff", is_staff=True))
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    assert f'href="{reverse("approvals:inbox")}"' not in response.content.decode()


def test_the_rest_of_the_admin_still_works(client):
    client.force_login(UserFactory(username="root", is_superuser=True))
    assert client.get(reverse("admin:agentruns_agentrun_changelist")).status_code == 200
    assert client.get(reverse("admin:login")).status_code == 302  # logged in: on to the index


def test_every_form_is_csrf_protected(decider, initiator):
    from django.test import Client

    run = start_waiting_run(initiator=initiator)
    client = Client(enforce_csrf_checks=True)
    client.force_login(decider)
    page = client.get(reverse("approvals:inbox")).content.decode()
    assert page.count('name="csrfmiddlewaretoken"') == page.count("<form")
    response = client.post(
        reverse("approvals:decide", args=[run.uuid]),
        {"decision": "approve", "turn_digest": run.pending_turn["turn_digest"]},
    )
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
