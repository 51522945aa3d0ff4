"""Approval deadlines in the inbox (docs/design.md §5.11): a card says when its wait ends and
what happens then; the run's timeline says the deadline decided."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.urls import reverse

from agentruns.models import AgentRun
from agentruns.services import reaper
from tests.agentruns.factories import AgentConfigurationFactory
from tests.approvals.conftest import make_in_doubt_run, start_input_run, start_waiting_run

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")


def page(client, path: str = INBOX) -> str:
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def timed(minutes: float, action: str = "deny"):
    return AgentConfigurationFactory(
        approval_timeout=timedelta(minutes=minutes), on_approval_timeout=action
    )


def test_an_approval_card_says_when_it_expires_and_that_it_is_then_denied(client, decider):
    run = start_waiting_run(configuration=timed(90))
    client.force_login(decider)
    html = page(client)
    assert "<dt>Deadline</dt>" in html
    assert "expires in 1\xa0hour, 29\xa0minutes" in html
    assert "then it is denied and the run continues" in html
    assert f'datetime="{run.approval_deadline.isoformat(timespec="microseconds")}"' in html


def test_an_input_card_says_the_run_then_fails(client, decider):
    start_input_run(configuration=timed(10, "fail"))
    client.force_login(decider)
    html = page(client)
    assert "expires in 9\xa0minutes" in html
    assert "then the run fails" in html


def test_a_card_past_its_deadline_says_it_expired(client, decider):
    run = start_waiting_run(configuration=timed(10))
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(minutes=5))
    client.force_login(decider)
    assert "expired 5\xa0minutes ago" in page(client)


def test_a_card_without_a_deadline_or_in_doubt_shows_none(client, decider, monkeypatch):
    start_waiting_run()
    make_in_doubt_run(decider=decider, monkeypatch=monkeypatch, configuration=timed(10))
    client.force_login(decider)
    html = page(client)
    assert "Awaiting approval" in html and "Waiting for reconciliation" in html
    assert "<dt>Deadline</dt>" not in html


def test_the_timeline_says_the_deadline_decided(client, decider):
    run = start_waiting_run(configuration=timed(10, "fail"))
    AgentRun.objects.filter(pk=run.pk).update(approval_deadline=Now() - timedelta(seconds=1))
    [verdict] = reaper.reap_stale_runs().expired
    assert verdict.verdict == "dead_lettered"
    client.force_login(decider)
    html = page(client, reverse("approvals:run", args=[run.uuid]))
    assert "Expired: nobody decided before the deadline — the run failed: create_note" in html
    assert "the approval deadline" in html
    assert "nobody decided before its approval deadline" in html  # the termination reason
