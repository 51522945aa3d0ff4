"""``/`` leads each person where their work is (``config.front_door``), and ``/favicon.ico``
answers (a redirect to the static icon) instead of a 404 on every page."""

from __future__ import annotations

import pytest

from tests.agentruns.factories import UserFactory

pytestmark = pytest.mark.django_db

USE = "playground.use_playground"
DECIDE = "agentruns.decide_agentrun"


@pytest.mark.parametrize(
    ("permissions", "superuser", "where"),
    [
        ([USE], False, "/playground/"),
        ([USE, DECIDE], False, "/playground/"),
        ([], True, "/playground/"),
        ([DECIDE], False, "/admin/approvals/"),
        ([], False, "/admin/"),
    ],
)
def test_the_front_door_leads_staff_to_their_page(client, permissions, superuser, where) -> None:
    client.force_login(UserFactory(permissions=permissions, is_superuser=superuser))
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, where)


def test_anyone_else_is_sent_to_the_admin_login_and_back(client) -> None:
    response = client.get("/")
    assert (response.status_code, response["Location"]) == (302, "/admin/login/?next=/")
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/")["Location"] == "/admin/login/?next=/"


def test_the_favicon_is_found(client) -> None:
    response = client.get("/favicon.ico")
    assert (response.status_code, response["Location"]) == (301, "/static/agentruns/favicon.ico")
