"""Event-started runs: an event starts one run however often it is delivered; an event with a
correlation key delivers the input its run waits for, through the input service."""

from __future__ import annotations

import pytest

from agentruns.exceptions import (
    BadSignature,
    CorrelationKeyTaken,
    CorrelationKeyUnknown,
    EventIdReused,
    EventSourceNotFound,
    InvalidInput,
    NotPermitted,
    NotWaiting,
)
from agentruns.models import AgentRun, AgentRunEvent, EventKind, ReceivedEvent, Status
from agentruns.services import events as events_service
from agentruns.services.events import event_receive
from agentruns.services.runs import run_process_queued
from tests.agentruns.support.crashes import ProcessDied
from tests.agentruns.support.triggers import (
    SECRET,
    SECRET_ENV,
    event_source,
    receive_kwargs,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    return event_source()


def receive(body, **options):
    return event_receive(slug="events", **receive_kwargs(body, **options))


def test_an_event_starts_a_queued_run_with_its_data_in_the_prompt_as_the_actor(source):
    outcome = receive({"id": "evt-1", "data": {"order": 42}})

    assert (outcome.action, outcome.replayed) == ("started", False)
    run = AgentRun.objects.get(uuid=outcome.run_uuid)
    assert (run.status, run.initiator_id) == (Status.QUEUED, source.actor_id)
    assert run.prompt.startswith("Handle the event.")
    assert '"order": 42' in run.prompt and run.prompt.endswith("</event>")


def test_an_event_replayed_starts_one_run_and_answers_with_it(source):
    first = receive({"id": "evt-1", "data": {"order": 42}})
    again = receive({"id": "evt-1", "data": {"order": 42}})

    assert again.replayed and again.run_uuid == first.run_uuid
    assert AgentRun.objects.count() == 1
    assert ReceivedEvent.objects.count() == 1


def test_the_same_id_with_another_body_is_refused(source):
    receive({"id": "evt-1", "data": {"order": 42}})
    with pytest.raises(EventIdReused):
        receive({"id": "evt-1", "data": {"order": 43}})
    assert AgentRun.objects.count() == 1


def test_a_bad_signature_writes_nothing(source):
    with pytest.raises(BadSignature):
        receive({"id": "evt-1"}, secret="not-the-secret")
    assert not AgentRun.objects.exists() and not ReceivedEvent.objects.exists()


def test_without_its_secret_the_endpoint_is_off(monkeypatch, source):
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(EventSourceNotFound):
        receive({"id": "evt-1"})
    monkeypatch.setenv(SECRET_ENV, "   ")
    with pytest.raises(EventSourceNotFound):
        receive({"id": "evt-1"})


def test_a_secret_name_the_rule_refuses_is_never_read(monkeypatch, source):
    monkeypatch.setenv("DJANGO_SECRET_KEY", SECRET)
    source.__class__.objects.filter(pk=source.pk).update(secret_env="DJANGO_SECRET_KEY")
    with pytest.raises(EventSourceNotFound):
        receive({"id": "evt-1"})


def test_a_disabled_source_or_an_inactive_configuration_is_not_found(source):
    source.__class__.objects.filter(pk=source.pk).update(enabled=False)
    with pytest.raises(EventSourceNotFound):
        receive({"id": "evt-1"})


def test_an_actor_who_may_not_start_runs_is_refused(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    event_source(actor_permissions=[])
    with pytest.raises(NotPermitted, match="start_agentrun"):
        receive({"id": "evt-1"})
    assert not ReceivedEvent.objects.exists()


def test_a_correlation_key_names_one_run(source):
    receive({"id": "evt-1", "correlation_key": "order-42"})
    with pytest.raises(CorrelationKeyTaken):
        receive({"id": "evt-2", "correlation_key": "order-42"})
    assert AgentRun.objects.count() == 1


def waiting_run(key: str = "order-42") -> AgentRun:
    """A run started by an event with ``key``, processed until it waits for input."""
    outcome = receive({"id": f"start-{key}", "correlation_key": key, "data": {"q": "colour?"}})
    run_process_queued(run_uuid=outcome.run_uuid)
    run = AgentRun.objects.get(uuid=outcome.run_uuid)
    assert run.status == Status.WAITING_FOR_INPUT
    return run


def test_an_event_with_the_key_delivers_the_input_the_run_waits_for(source):
    run = waiting_run()

    outcome = receive(
        {"id": "answer-1", "correlation_key": "order-42", "input": {"answer": "blue"}}
    )

    assert (outcome.action, outcome.run_uuid, outcome.replayed) == ("input", run.uuid, False)
    run.refresh_from_db()
    assert run.status == Status.QUEUED
    given = AgentRunEvent.objects.get(run=run, kind=EventKind.INPUT)
    assert given.payload["values"] == {"answer": "blue"}
    assert given.payload["decider"] == source.actor.get_username()
    run_process_queued(run_uuid=run.uuid)
    run.refresh_from_db()
    assert (run.status, run.output) == (Status.COMPLETED, "thanks")


def test_input_replayed_is_delivered_once(source):
    run = waiting_run()
    body = {"id": "answer-1", "correlation_key": "order-42", "input": {"answer": "blue"}}
    receive(body)
    again = receive(body)
    assert again.replayed and again.run_uuid == run.uuid
    assert AgentRunEvent.objects.filter(run=run, kind=EventKind.INPUT).count() == 1


def test_input_that_breaks_the_schema_is_refused_and_the_run_keeps_waiting(source):
    run = waiting_run()
    with pytest.raises(InvalidInput) as refused:
        receive({"id": "answer-1", "correlation_key": "order-42", "input": {"priority": "high"}})
    assert refused.value.detail["errors"]
    run.refresh_from_db()
    assert run.status == Status.WAITING_FOR_INPUT
    # The event id was not used up: the corrected event may carry it.
    fixed = receive({"id": "answer-1", "correlation_key": "order-42", "input": {"answer": "red"}})
    assert fixed.action == "input" and not fixed.replayed


def test_input_for_an_unknown_key_or_a_run_not_waiting_is_refused(source):
    with pytest.raises(CorrelationKeyUnknown):
        receive({"id": "a", "correlation_key": "nobody", "input": {"answer": "x"}})
    receive({"id": "start", "correlation_key": "queued-one"})  # queued: not waiting for input
    with pytest.raises(NotWaiting):
        receive({"id": "b", "correlation_key": "queued-one", "input": {"answer": "x"}})


def test_delivering_input_needs_the_actor_to_decide(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    source = event_source(actor_permissions=["agentruns.start_agentrun"])
    waiting_run()
    with pytest.raises(NotPermitted, match="decide_agentrun"):
        receive({"id": "answer", "correlation_key": "order-42", "input": {"answer": "x"}})
    assert source.pk


def test_a_process_dying_after_the_run_was_inserted_leaves_no_event_used(source, monkeypatch):
    """The worst gap: the run inserted, the process dies before the event is recorded. Both were
    in one transaction: nothing stays, and the sender's retry starts the one run."""

    def die(*args, **kwargs):
        raise ProcessDied()

    with monkeypatch.context() as patched:
        patched.setattr(events_service, "_record", die)
        with pytest.raises(ProcessDied):
            receive({"id": "evt-1", "data": {}})
    assert not AgentRun.objects.exists() and not ReceivedEvent.objects.exists()
    assert not receive({"id": "evt-1", "data": {}}).replayed
    assert AgentRun.objects.count() == 1
