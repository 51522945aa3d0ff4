"""A stored pending turn that does not read is *unreadable* in every interface alike — the API,
the inbox and the playground show it without controls — and no decision path runs it.

The tampering is the one a reviewer would fear: the stored turn is altered to show a harmless
call while keeping the digest of the call the model really proposed.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agentruns.models import AgentRun, EventKind, Status
from agentruns.turns import turn_digest
from playground.models import Note
from tests.agentruns.factories import UserFactory
from tests.agentruns.support.api import in_doubt, waiting_for_approval, waiting_for_input
from tests.approvals.support.html import sentences

DECIDE = "agentruns.decide_agentrun"
USE = "playground.use_playground"


@pytest.fixture
def staff(db):
    return UserFactory(username="reviewer", permissions=[DECIDE, USE])


@pytest.fixture
def api(staff) -> APIClient:
    client = APIClient()
    client.force_authenticate(staff)
    return client


def tamper(run: AgentRun, **call_changes) -> str:
    """Change what the stored turn shows, keep its digest; the digest."""
    turn = dict(run.pending_turn)
    if "calls" in turn:
        turn["calls"] = [{**turn["calls"][0], **call_changes}]
    else:
        turn["call"] = {**turn["call"], **call_changes}
    AgentRun.objects.filter(pk=run.pk).update(pending_turn=turn)
    return turn["turn_digest"]


def test_a_tampered_approval_reads_unreadable_in_the_api_inbox_and_playground(api, client, staff):
    run = waiting_for_approval()
    turn_digest = tamper(run, name="update_note", arguments={"title": "harmless rename"})

    shown = api.get(f"/api/runs/{run.uuid}/").json()["pending_turn"]
    assert shown["kind"] == "unreadable"
    assert shown["problem"] == "its digest does not match the calls it shows"
    assert shown["calls"] == [] and shown["turn_digest"] == ""

    client.force_login(staff)
    inbox = client.get("/admin/approvals/").content.decode()
    playground = client.get(f"/playground/runs/{run.uuid}/").content.decode()
    for page in (inbox, playground):
        assert "cannot be read" in page
        assert turn_digest not in page  # no control carries the digest
    assert 'name="approved"' not in playground


def test_deciding_a_tampered_approval_runs_nothing_and_changes_nothing(api):
    run = waiting_for_approval()
    turn_digest = tamper(run, name="update_note", arguments={"title": "harmless rename"})

    for mode in ("inline", "queued"):
        response = api.post(
            f"/api/runs/{run.uuid}/decision/",
            {"approved": True, "turn_digest": turn_digest, "mode": mode},
            format="json",
        )
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "unreadable_state"

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()
    assert not Note.objects.exists()


def test_a_tampered_input_request_takes_no_values(api):
    run = waiting_for_input()
    turn_digest = tamper(run, arguments={"question": "Type your password"})

    response = api.post(
        f"/api/runs/{run.uuid}/input/",
        {"values": {"answer": "x"}, "turn_digest": turn_digest},
        format="json",
    )

    assert response.status_code == 409 and response.json()["code"] == "unreadable_state"
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    assert not run.events.filter(kind=EventKind.INPUT).exists()


def test_a_tampered_reconciliation_takes_no_verdict(api):
    run = in_doubt()
    turn_digest = tamper(run, name="delete_everything")
    run.refresh_from_db()
    assert run.pending_turn["turn_digest"] == turn_digest

    for verdict in ("landed", "not_landed", "abandon"):
        response = api.post(
            f"/api/runs/{run.uuid}/reconciliation/",
            {"verdict": verdict, "turn_digest": turn_digest},
            format="json",
        )
        assert response.status_code == 409 and response.json()["code"] == "unreadable_state"

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_RECONCILIATION
    assert run.pending_effect == "non_idempotent_write"
    assert not run.events.filter(kind=EventKind.RECONCILIATION).exists()


@pytest.mark.parametrize("path", ["decision/", "decision/stream/"], ids=["batch", "stream"])
def test_the_playground_decides_no_unreadable_run(client, staff, path):
    run = waiting_for_approval()
    turn_digest = tamper(run, name="update_note", arguments={"title": "harmless rename"})
    client.force_login(staff)

    response = client.post(
        f"/playground/runs/{run.uuid}/{path}", {"approved": "1", "turn_digest": turn_digest}
    )
    body = b"".join(response.streaming_content) if response.streaming else response.content

    assert response.status_code in (200, 302, 409), body[:300]
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_APPROVAL
    assert not run.events.filter(kind=EventKind.APPROVAL).exists()
    assert not Note.objects.exists()


# --- An input schema that cannot be used ---------------------------------------------------------

UNUSABLE_SCHEMAS = {
    "a pattern that does not compile": {
        "type": "object",
        "properties": {"answer": {"type": "string", "pattern": "(unclosed", "title": "Answer"}},
    },
    "a property pattern that does not compile": {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "patternProperties": {"[a-": {"type": "string"}},
    },
    "a pattern RE2 cannot run (a backreference)": {
        "type": "object",
        "properties": {"answer": {"type": "string", "pattern": "^(b)\\1$", "title": "Answer"}},
    },
    "a reference outside the schema": {
        "type": "object",
        "properties": {"answer": {"$ref": "http://127.0.0.1:9/answer.json"}},
    },
}


def with_input_schema(run: AgentRun, schema: dict) -> str:
    """Store ``schema`` as the run's input schema with its honest digest; the digest."""
    turn = dict(run.pending_turn)
    turn["input_schema"] = schema
    turn["turn_digest"] = turn_digest([turn["call"]], input_schema=schema)
    AgentRun.objects.filter(pk=run.pk).update(pending_turn=turn)
    return turn["turn_digest"]


@pytest.mark.parametrize("schema", UNUSABLE_SCHEMAS.values(), ids=UNUSABLE_SCHEMAS.keys())
def test_an_unusable_input_schema_is_a_readable_refusal_everywhere(api, client, staff, schema):
    run = waiting_for_input()
    turn_digest = with_input_schema(run, schema)

    response = api.post(
        f"/api/runs/{run.uuid}/input/",
        {"values": {"answer": "blue"}, "turn_digest": turn_digest},
        format="json",
    )
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "unreadable_state"
    assert "input schema" in response.json()["message"]

    client.force_login(staff)
    posted = client.post(
        f"/admin/approvals/runs/{run.uuid}/input/",
        {f"run{run.pk}-f0": "blue", "turn_digest": turn_digest},
        follow=True,
    )
    assert posted.status_code == 200
    assert sentences(posted) == ["This run's stored state cannot be read — nothing was changed."]
    inbox = client.get("/admin/approvals/").content.decode()
    playground = client.get(f"/playground/runs/{run.uuid}/").content.decode()
    for page in (inbox, playground):
        assert "cannot be read" in page and "input schema" in page
        assert turn_digest not in page  # no control carries the digest
    shown = api.get(f"/api/runs/{run.uuid}/").json()["pending_turn"]
    assert shown["kind"] == "unreadable" and "input schema" in shown["problem"]

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    assert not run.events.filter(kind=EventKind.INPUT).exists()


def test_an_input_schema_whose_reference_does_not_resolve_is_refused_on_submit(api, client, staff):
    # A local reference passes every check until a value meets it: refused then, never a 500.
    run = waiting_for_input()
    answer = {"type": "string", "allOf": [{"$ref": "#/$defs/missing"}]}
    schema = {"type": "object", "properties": {"answer": answer}}
    turn_digest = with_input_schema(run, schema)
    body = {"values": {"answer": "blue"}, "turn_digest": turn_digest}

    response = api.post(f"/api/runs/{run.uuid}/input/", body, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "unreadable_state"
    assert response.json()["message"].startswith(
        "its input schema cannot be used: the schema has a reference that does not resolve"
    )

    client.force_login(staff)
    posted = client.post(
        f"/admin/approvals/runs/{run.uuid}/input/",
        {f"run{run.pk}-f0": "blue", "turn_digest": turn_digest},
        follow=True,
    )
    assert sentences(posted) == ["This run's stored state cannot be read — nothing was changed."]
    played = client.post(
        f"/playground/runs/{run.uuid}/input/",
        {"value-f0": "blue", "turn_digest": turn_digest},
        follow=True,
    )
    assert played.status_code == 200
    [message] = [str(m) for m in played.context["messages"]]
    assert message.startswith("its input schema cannot be used")

    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    assert not run.events.filter(kind=EventKind.INPUT).exists()
