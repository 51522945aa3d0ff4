"""Recent runs (status, termination reason, attribution) and the run timeline."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentruns.models import AgentRun
from agentruns.services import runs
from tests.agentruns.factories import AgentRunFactory
from tests.approvals.conftest import start_waiting_run
from tests.approvals.support.html import heading_levels, headings_in_order, sentences

pytestmark = pytest.mark.django_db


def approve(run, actor):
    runs.run_decide(
        run_uuid=run.uuid,
        actor=actor,
        approved=True,
        turn_digest=run.pending_turn["turn_digest"],
        mode="queued",
    )
    runs.run_process_queued(run_uuid=run.uuid)


def test_recent_runs_show_status_reason_and_attribution(client, decider, colleague):
    own = start_waiting_run(initiator=decider)
    approve(own, decider)
    other = start_waiting_run(initiator=decider)
    approve(other, colleague)
    AgentRunFactory(failed=True, initiator=None)
    client.force_login(decider)
    html = client.get(reverse("approvals:recent")).content.decode()
    assert html.count("Self-approved</strong>") == 1  # a visible badge, in words
    assert "The person who started this run approved its writes themselves." in html
    assert "Its writes were approved by someone other than who started it." in html
    assert "No writes were approved in this run." in html
    assert "completed" in html and "the provider failed" in html
    assert f'href="{reverse("approvals:run", args=[own.uuid])}"' in html
    assert headings_in_order(heading_levels(html))


def test_recent_runs_cost_the_same_queries_for_any_page_size(client, decider):
    def queries_for_page() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("approvals:recent")).status_code == 200
        return len(captured.captured_queries)

    client.force_login(decider)
    run = start_waiting_run(initiator=decider)
    approve(run, decider)
    few = queries_for_page()
    for _ in range(6):
        approve(start_waiting_run(initiator=decider), decider)
    AgentRun.objects.bulk_create(
        [
            AgentRun(configuration=run.configuration, prompt=f"p{i}", status="queued")
            for i in range(60)
        ]
    )
    html = client.get(reverse("approvals:recent")).content.decode()
    table = html.split('class="approvals-recent"')[1]  # (the admin's sidebar has its own table)
    assert table.count("<tr>") == 51  # a full page of 50 runs, plus the header row
    assert queries_for_page() == few


def test_the_timeline_lists_every_event_in_order(client, decider, colleague):
    run = start_waiting_run(initiator=decider)
    approve(run, colleague)
    client.force_login(decider)
    html = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    events = list(run.events.order_by("sequence"))
    assert len(events) >= 6
    rows = html[html.index("<tbody>") : html.index("</tbody>")].split("<tr>")[1:]
    assert len(rows) == len(events)
    for row, event in zip(rows, events, strict=True):
        assert f'<td data-label="#">{event.sequence}</td>' in row
        assert f'<td data-label="Kind">{event.get_kind_display()}</td>' in row
        assert f'<td data-label="Epoch">{event.lease_epoch}</td>' in row
        if event.segment:
            assert f"<code>{event.segment}</code>" in row
        if event.duration_ms is not None:
            assert f"{event.duration_ms} ms" in row
    approval = next(r for r, e in zip(rows, events, strict=True) if e.kind == "approval")
    assert (
        '<td data-label="Decider">colleague</td>' in approval
        and "Approved: create_note" in approval
    )
    assert "Its writes were approved by someone other than who started it." in html
    assert "Completed" in html or "completed" in html
    assert headings_in_order(heading_levels(html))


def test_the_timeline_of_a_waiting_run_carries_its_card(client, decider):
    run = start_waiting_run(initiator=decider)
    client.force_login(decider)
    html = client.get(reverse("approvals:run", args=[run.uuid])).content.decode()
    assert "What it waits for" in html and 'value="approve"' in html
    assert headings_in_order(heading_levels(html))


def test_an_unknown_run_page_goes_back_to_the_inbox(client, decider):
    import uuid

    client.force_login(decider)
    response = client.get(reverse("approvals:run", args=[uuid.uuid4()]), follow=True)
    assert response.redirect_chain == [(reverse("approvals:inbox"), 302)]
    assert sentences(response) == ["That run does not exist."]
