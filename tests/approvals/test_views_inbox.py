"""The inbox page: one card per waiting run, oldest first, paginated; every card type; markup
from the model arrives escaped; the page costs the same number of queries for 5 and 500 runs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentruns.models import AgentRun, Status
from agentruns.turns import turn_digest
from tests.agentruns.factories import AgentConfigurationFactory, AgentRunFactory
from tests.agentruns.support.api import card_digest
from tests.approvals.conftest import (
    approval_turn,
    bulk_waiting_runs,
    make_in_doubt_run,
    start_input_run,
    start_waiting_run,
)
from tests.approvals.support.html import (
    heading_levels,
    headings_in_order,
    inspect,
    unlabelled_fields,
)

pytestmark = pytest.mark.django_db

INBOX = reverse("approvals:inbox")


def page(client, path=INBOX) -> str:
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def test_an_empty_inbox_says_so(client, decider):
    client.force_login(decider)
    assert "Nothing is waiting for a decision." in page(client)


def test_an_approval_card_shows_what_will_run_and_binds_the_buttons_to_it(
    client, decider, initiator
):
    run = start_waiting_run(initiator=initiator)
    client.force_login(decider)
    html = page(client)
    assert "Awaiting approval" in html
    assert run.configuration.name in html and run.configuration.slug in html
    assert ">initiator<" in html
    assert "<time datetime=" in html  # the age
    assert "<code>create_note</code>" in html
    # The badge says it in words (and an icon); colour is only a third signal.
    assert "<strong>Write</strong> <span>(non-idempotent: not safe to repeat)</span>" in html
    assert "&quot;title&quot;: &quot;Quarterly report&quot;" in html  # pretty-printed JSON
    assert f'name="turn_digest" value="{card_digest(run)}"' in html
    assert '<button type="submit" name="decision" value="approve"' in html
    assert '<button type="submit" name="decision" value="deny"' in html
    assert '<fieldset class="approvals-decide">' in html and "<legend>Decide run" in html
    # Per call: a group of verdicts, named by its legend, with a reason, an answer and an edit.
    assert f'<fieldset class="lh-verdict" id="run{run.pk}-c1">' in html
    assert "<legend>Your verdict on call 1: <code>create_note</code></legend>" in html
    for verdict in ("approve", "deny", "answer", "edit"):
        assert f'name="run{run.pk}-c1-verdict" value="{verdict}"' in html
    # The edit form is the tool's schema, the model's values filled in.
    assert f'name="run{run.pk}-c1-e-f0" value="Quarterly report"' in html


def test_long_arguments_fold_into_details(client, decider, initiator):
    start_waiting_run(initiator=initiator, arguments={"title": "Long", "body": "word " * 400})
    start_waiting_run(initiator=initiator, arguments={"title": "Short", "body": "brief"})
    client.force_login(decider)
    html = page(client)
    # A write's arguments are open however long (a reviewer must read them); reads fold.
    assert html.count('<details class="approvals-args">') == 0
    assert "Arguments (4 lines" in html and "word word" in html
    # The preview's long value folds too, the short one does not.
    assert html.count("<details><summary>2000 characters, 1 lines</summary>") == 1


def test_cards_come_oldest_first_and_paginate(client, decider):
    created = bulk_waiting_runs(25)
    client.force_login(decider)
    first = page(client)
    positions = [first.index(f"run-{run.uuid}") for run in created[:20]]
    assert positions == sorted(positions)
    assert f"run-{created[20].uuid}" not in first
    assert "Page 1 of 2 (25 runs)" in first
    second = page(client, INBOX + "?page=2")
    assert all(f"run-{run.uuid}" in second for run in created[20:])


def test_the_kind_filter(client, decider, initiator, monkeypatch):
    start_waiting_run(initiator=initiator)
    start_input_run(initiator=initiator)
    make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    client.force_login(decider)
    everything = page(client)
    assert "Everything (3)" in everything
    assert all(
        kind in everything
        for kind in ("Awaiting approval", "Waiting for input", "Waiting for reconciliation")
    )
    only_input = page(client, INBOX + "?kind=input")
    assert "Waiting for input" in only_input and "Awaiting approval</span>" not in only_input


def test_an_input_card_has_a_labelled_form_from_the_schema(client, decider, initiator):
    run = start_input_run(initiator=initiator)
    client.force_login(decider)
    html = page(client)
    assert "Waiting for input" in html
    assert f'action="{reverse("approvals:input", args=[run.uuid])}"' in html
    assert f'id="id_run{run.pk}-f0"' in html and "Your answer (required)" in html
    assert 'type="number"' in html and "Priority (0 or more) (optional)" in html
    assert unlabelled_fields(html) == []


def test_a_reconciliation_card_shows_the_call_in_flight(client, decider, initiator, monkeypatch):
    run = make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    client.force_login(decider)
    html = page(client)
    assert "Waiting for reconciliation" in html
    assert f"<code>{run.uuid}:{run.pending_turn['call']['id']}</code>" in html  # idempotency key
    assert f"<code>{run.pending_turn['segment']}</code>" in html  # the segment that died
    assert run.pending_turn["segment"].startswith("worker:")
    assert "Its lease expired" in html and "<time datetime=" in html
    for verdict in ("landed", "not_landed", "abandon"):
        assert f'name="verdict" value="{verdict}"' in html
    assert f'name="turn_digest" value="{card_digest(run)}"' in html


@pytest.mark.parametrize(
    "status, pending_turn, problem",
    [
        (Status.WAITING_FOR_APPROVAL, None, "no pending turn is stored"),
        (Status.WAITING_FOR_APPROVAL, "garbage", "no pending turn is stored"),
        (Status.WAITING_FOR_APPROVAL, {"kind": "input"}, "does not match the run&#x27;s status"),
        (
            Status.WAITING_FOR_APPROVAL,
            {**approval_turn(1), "turn_digest": "0" * 64},
            "its digest does not match the calls it shows",
        ),
        (
            Status.WAITING_FOR_APPROVAL,
            {**approval_turn(1), "calls": [{"id": "call_1", "name": "x", "effect": "magic"}]},
            "call 1 has an unknown effect",
        ),
        (Status.WAITING_FOR_INPUT, {"kind": "input", "turn_digest": "x"}, "the call is not"),
        (Status.WAITING_FOR_RECONCILIATION, {"kind": "reconciliation"}, "no turn digest"),
    ],
)
def test_an_unreadable_turn_gets_a_card_without_controls(
    client, decider, status, pending_turn, problem
):
    run = AgentRunFactory(status=status, pending_turn=pending_turn)
    client.force_login(decider)
    html = page(client)
    assert "Unreadable</span>" in html
    assert problem in html
    card = html[html.index(f'id="run-{run.uuid}"') :]
    card = card[: card.index("</article>")]
    assert "<form" not in card and "<button" not in card


def test_an_unsupported_required_field_is_said_never_an_empty_form(client, decider):
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["tags"],
    }
    input_run(schema)
    client.force_login(decider)
    html = page(client)
    assert "This input cannot be given here." in html
    assert "The field “tags” has the type “array”, which this form cannot show" in html
    assert 'class="approvals-input"' not in html


def test_an_optional_unsupported_field_is_left_out_and_said(client, decider):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "extra": {"type": "object"}},
        "required": ["answer"],
    }
    input_run(schema)
    client.force_login(decider)
    html = page(client)
    assert 'class="approvals-input"' in html
    assert "it is optional and will be left out" in html


def input_run(schema, call_name="ask_human") -> AgentRun:
    call = {"id": "call_0_0", "name": call_name, "arguments": {"question": "q"}}
    return AgentRunFactory(
        status=Status.WAITING_FOR_INPUT,
        pending_turn={
            "kind": "input",
            "call": {**call, "effect": "read"},
            "input_schema": schema,
            "turn_digest": turn_digest([call], input_schema=schema),
        },
    )


def test_model_chosen_markup_arrives_escaped(client, decider, initiator):
    evil_tool = "<img src=x onerror=alert('tool')>"
    evil_args = {"title": "<script>alert('title')</script>", "body": '"><b onclick=x>bold</b>'}
    config = AgentConfigurationFactory(name="<i>Config</i>")
    start_waiting_run(initiator=initiator, arguments=evil_args, configuration=config)
    run = start_waiting_run(initiator=initiator, tool=evil_tool, arguments=evil_args)
    client.force_login(decider)
    for path in (INBOX, reverse("approvals:run", args=[run.uuid]), reverse("approvals:recent")):
        html = page(client, path)
        for raw in (evil_tool, "<script>alert", "<b onclick", "<i>Config</i>"):
            assert raw not in html, (path, raw)
    html = page(client)
    assert "&lt;img src=x onerror=alert(&#x27;tool&#x27;)&gt;" in html
    assert "&lt;script&gt;alert(&#x27;title&#x27;)&lt;/script&gt;" in html
    assert "Unknown tool — treated as a non-idempotent write." in html


def test_headings_are_in_order_and_every_field_is_labelled(client, decider, initiator, monkeypatch):
    start_waiting_run(initiator=initiator)
    start_input_run(initiator=initiator)
    make_in_doubt_run(decider=decider, initiator=initiator, monkeypatch=monkeypatch)
    AgentRunFactory(status=Status.WAITING_FOR_APPROVAL, pending_turn=None)
    client.force_login(decider)
    html = page(client)
    levels = heading_levels(html)
    assert headings_in_order(levels), levels
    assert levels.count(3) == 4  # one card heading per run
    assert unlabelled_fields(html) == []
    assert all(f.get("method") == "post" for f in inspect(html).forms if f.get("action"))


def test_the_inbox_costs_the_same_queries_for_5_and_500_waiting_runs(client, decider):
    client.force_login(decider)
    client.get(INBOX)  # warm the session and the permission cache paths

    bulk_waiting_runs(5)
    with CaptureQueriesContext(connection) as five:
        html = page(client)
    assert html.count('class="approvals-card ') == 5

    bulk_waiting_runs(495)
    with CaptureQueriesContext(connection) as five_hundred:
        html = page(client)
    assert html.count('class="approvals-card ') == 20  # one page
    assert AgentRun.objects.filter(status=Status.WAITING_FOR_APPROVAL).count() == 500
    assert len(five_hundred.captured_queries) == len(five.captured_queries), [
        q["sql"] for q in five_hundred.captured_queries
    ]
