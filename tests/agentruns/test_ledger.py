"""The tamper-evident ledger (issue 13 §2): every event chained to the one before it, the head on
the run row, ``verify_ledger`` naming what was changed, deleted, swapped or cut off, and the
audit export verified by the README's standalone script. On SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from datetime import timezone as timezone_of

import pytest
from django.db import connection
from django.utils import timezone

from agentruns import audit, ledger
from agentruns.models import AgentRun, AgentRunEvent, EventKind
from agentruns.services import runs
from tests.agentruns.factories import AgentConfigurationFactory, UserFactory
from tests.agentruns.support.ledger import (
    DECIDER,
    api_for,
    approved_run,
    export,
    readme_script,
    run_script,
    sql,
    stream,
    verify,
)

pytestmark = pytest.mark.django_db


def test_every_event_chains_to_the_one_before_and_the_head_names_the_last():
    run = approved_run()
    events = stream(run)
    assert [e.kind for e in events][:2] == [EventKind.LEASE, EventKind.REQUEST]
    assert any(e.actor_id is not None and e.actor_ref == e.actor_id for e in events)
    head = ledger.genesis(run.uuid)
    for event in events:
        assert event.prev_hash == head
        assert (event.ledger_version, event.ledger_key) == (ledger.VERSION, "")
        assert event.hash == ledger.event_hash(
            event.prev_hash,
            run_uuid=run.uuid,
            sequence=event.sequence,
            kind=event.kind,
            payload=event.payload,
            segment=event.segment,
            lease_epoch=event.lease_epoch,
            actor_id=event.actor_ref,
            version=ledger.VERSION,
            created_at=event.created_at,
            duration_ms=event.duration_ms,
        )
        head = event.hash
    assert run.ledger_head == head


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("actor_id", [None, 7])
def test_the_chain_hashes_exactly_the_documented_canonical_record(actor_id, keyed):
    """``chain`` builds the canonical text inline for speed: it must equal ``canonical``'s (and
    so the README's standalone verifier's) for any payload, kind, segment and actor."""
    from uuid import uuid4

    from agentruns.leases import EventSpec

    run_uuid = uuid4()
    payloads = [
        {},
        {"b": 1.0, "a": [2.0, 2.5, ("t", None)], 3: {True: 1e16, "é": '\u2028 "q"'}},
        [1, {"z": {"y": [0.5]}}],
        # Hostile values for the prebuilt encoder: big and negative integers, floats at the
        # edges of their text forms, control and astral characters, deep nesting.
        {
            "big": 2**80,
            "neg": -(2**70),
            "f": [1e-7, -2.5e300, 0.1 + 0.2, -0.0, 1e16, 123456789.125],
            "s": '\x00\x1f\u00e9\u4e2d\U0001f600\\/"',
            "\U0001f600": {"deep": [[[[{"k": [True, False, None]}]]]]},
        },
        "a bare string \u2603",
        2**64,
    ]
    kinds = [EventKind.TOOL, "custom", EventKind.LLM, EventKind.REQUEST, "Ünïcode", "tool"]
    durations = [None, 0, 17, 2**31, None, 5]
    events = [
        EventSpec(kind, payload, actor_id=actor_id, duration_ms=ms)
        for kind, payload, ms in zip(kinds, payloads, durations, strict=True)
    ]
    key = ledger.key_of("k" * 40) if keyed else None
    # Microseconds of 0 are still written with six digits; another zone is written in UTC.
    moments = [
        datetime(2026, 12, 1, 23, 59, 59, 0, tzinfo=UTC),
        datetime(2026, 12, 2, 1, 2, 3, 456789, tzinfo=timezone_of(timedelta(hours=5))),
    ]
    # Signers one after the other (``chain`` keeps the last one's text): each gets its own.
    signers = [
        (run_uuid, 'seg "é" \\ 1', 12),
        (run_uuid, 'seg "é" \\ 1', 13),
        (str(run_uuid).upper(), "worker:h:2", 13),
        (uuid4(), "worker:h:2", 13),
        (run_uuid, 'seg "é" \\ 1', 12),
    ]
    for index, (signer_uuid, segment, epoch) in enumerate(signers):
        moment = moments[index % 2]
        links, head = ledger.chain(
            run_uuid=signer_uuid,
            prev_hash=ledger.genesis(signer_uuid),
            first_sequence=41,
            segment=segment,
            lease_epoch=epoch,
            events=events,
            created_at=moment,
            key=key,
        )
        prev = ledger.genesis(signer_uuid)
        for sequence, (spec, link) in enumerate(zip(events, links, strict=True), start=41):
            text = ledger.canonical(
                run_uuid=str(signer_uuid).lower(),
                sequence=sequence,
                kind=str(spec.kind),
                payload=ledger.canonical_payload(spec.payload),
                segment=segment,
                lease_epoch=epoch,
                actor_id=actor_id,
                created_at=moment,
                duration_ms=spec.duration_ms,
                key_id=key.id if key else "",
            )
            record = json.loads(text)
            assert record["created_at"] == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            assert (record["duration_ms"], record["v"]) == (spec.duration_ms, ledger.VERSION)
            assert type(link) is ledger.Link
            secret = key.secret if key else None
            expected = ledger.link(prev, text, secret)
            assert link == ledger.Link(prev, expected, moment, key.id if key else "")
            prev = link.hash
        assert head == prev


def test_a_queued_run_starts_at_its_genesis_and_chains_from_its_claim():
    configuration = AgentConfigurationFactory(tools=[], script=[{"content": "hi"}])
    run = runs.run_enqueue(configuration=configuration, prompt="go")
    assert AgentRun.objects.get(pk=run.pk).ledger_head == ledger.genesis(run.uuid)
    runs.run_process_queued(run_uuid=run.uuid)
    count = len(stream(run))
    assert verify("--run", str(run.uuid)) == (0, f"1 runs, {count} events intact ({count} plain)\n")


def test_verify_ledger_reports_intact_runs_and_counts_them():
    first, second = approved_run(), approved_run(floats=True)
    total = len(stream(first)) + len(stream(second))
    assert verify() == (0, f"2 runs, {total} events intact ({total} plain)\n")


def test_a_payload_changed_by_sql_is_named():
    run, other = approved_run(), approved_run()
    target = stream(run)[3]
    sql(
        f"UPDATE {AgentRunEvent._meta.db_table} SET payload = %s WHERE id = %s",
        ['{"forged": true}', target.pk],
    )
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence 3 (changed)" in output
    assert str(other.uuid) not in output
    assert "1 of 2 runs broken" in output


def test_a_deleted_event_is_named():
    run = approved_run()
    sql(f"DELETE FROM {AgentRunEvent._meta.db_table} WHERE id = %s", [stream(run)[2].pk])
    assert verify("--run", str(run.uuid))[0] == 1
    assert f"{run.uuid}: broken at sequence 2 (missing)" in verify()[1]


def test_two_swapped_events_are_named():
    run = approved_run()
    a, b = stream(run)[1:3]
    table = AgentRunEvent._meta.db_table
    sql(f"UPDATE {table} SET sequence = 1000000 WHERE id = %s", [a.pk])
    sql(f"UPDATE {table} SET sequence = %s WHERE id = %s", [a.sequence, b.pk])
    sql(f"UPDATE {table} SET sequence = %s WHERE id = %s", [b.sequence, a.pk])
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence 1 (reordered)" in output


def test_an_altered_head_is_named():
    run = approved_run()
    AgentRun.objects.filter(pk=run.pk).update(ledger_head="0" * 64)
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence {len(stream(run))} (head mismatch)" in output


def test_removing_the_last_events_is_named_through_the_head():
    run = approved_run()
    count = len(stream(run))
    AgentRunEvent.objects.filter(run=run, sequence__gte=count - 2).delete()
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence {count - 2} (head mismatch)" in output


def test_a_decision_moved_to_someone_else_is_named_but_a_deleted_account_is_not():
    run = approved_run()
    [approval] = [e for e in stream(run) if e.kind == EventKind.APPROVAL]
    someone = UserFactory()
    AgentRunEvent.objects.filter(pk=approval.pk).update(actor=someone)
    assert f"broken at sequence {approval.sequence} (changed)" in verify()[1]

    AgentRunEvent.objects.filter(pk=approval.pk).update(actor=approval.actor_id)
    approval.actor.delete()  # the event keeps actor_ref; the ledger is unchanged
    assert AgentRunEvent.objects.get(pk=approval.pk).actor_id is None
    assert verify()[0] == 0


def test_run_and_since_narrow_what_is_verified_and_bad_arguments_exit_2():
    old, new = approved_run(), approved_run()
    AgentRun.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=10))
    AgentRunEvent.objects.filter(run=old).update(payload={"forged": True})
    since = (timezone.now() - timedelta(days=1)).date().isoformat()
    count = len(stream(new))
    assert verify("--since", since) == (0, f"1 runs, {count} events intact ({count} plain)\n")
    assert verify("--run", str(new.uuid))[0] == 0
    assert verify("--run", str(old.uuid))[0] == 1
    assert verify("--run", "not-a-uuid")[0] == 2
    assert verify("--run", "00000000-0000-0000-0000-000000000000")[0] == 2
    assert verify("--run", str(new.uuid)[:8])[0] == 0  # the short id the pages show
    assert verify("--since", "yesterday")[0] == 2


def test_verification_streams_batches_of_runs():
    made = [approved_run() for _ in range(3)]
    audit_batch = audit.RUNS_PER_BATCH
    try:
        audit.RUNS_PER_BATCH = 2
        report = audit.verify()
    finally:
        audit.RUNS_PER_BATCH = audit_batch
    assert (report.runs, report.intact) == (3, True)
    assert report.events == sum(len(stream(r)) for r in made)


# --- Export --------------------------------------------------------------------------------------


def test_the_readme_script_verifies_an_exported_file_without_leasehold(tmp_path):
    run = approved_run(floats=True)
    exported = export(run, tmp_path)
    lines = exported.read_text().splitlines()
    assert len(lines) == 1 + len(stream(run))
    script = readme_script(tmp_path)

    checked = run_script(script, exported)
    assert checked.returncode == 0, checked.stderr
    assert f"{len(stream(run))} events intact" in checked.stdout

    forged = exported.read_text().replace('"ratio":0.1', '"ratio":0.2')
    assert forged != exported.read_text()
    exported.write_text(forged)
    refused = run_script(script, exported)
    assert refused.returncode == 1
    assert "broken at sequence" in refused.stderr


def test_the_script_notices_a_file_cut_short(tmp_path):
    run = approved_run()
    exported = export(run, tmp_path)
    exported.write_text("".join(exported.read_text().splitlines(keepends=True)[:-1]))
    refused = run_script(readme_script(tmp_path), exported)
    assert refused.returncode == 1
    assert "head mismatch" in refused.stderr


def test_the_timeline_page_links_the_export_and_serves_the_same_file(client, tmp_path):
    run = approved_run()
    staff = UserFactory(is_staff=True, permissions=DECIDER)
    client.force_login(staff)
    page = client.get(f"/admin/approvals/runs/{run.uuid}/")
    assert page.status_code == 200
    link = f"/admin/approvals/runs/{run.uuid}/audit.jsonl"
    assert link in page.content.decode()
    download = client.get(link)
    assert download.status_code == 200
    body = b"".join(download.streaming_content)
    assert body == export(run, tmp_path).read_bytes()


def test_the_export_is_refused_to_someone_who_may_not_see_the_run():
    run = approved_run()
    stranger = UserFactory(is_staff=True)
    response = api_for(stranger).get(f"/api/runs/{run.uuid}/audit/")
    assert response.status_code == 404
    assert response.json()["code"] == "run_not_found"


def test_the_schema_documents_the_audit_endpoint():
    staff = UserFactory(is_staff=True)
    schema = api_for(staff).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/runs/{uuid}/audit/"]["get"]
    assert operation["operationId"] == "runs_audit"
    assert "application/jsonl" in operation["responses"]["200"]["content"]


# --- The migration fills the chain for existing runs ---------------------------------------------

BEFORE_THE_LEDGER = ("agentruns", "0012_metrics_counter")


def migrate(targets: list[tuple[str, str]]) -> None:
    from django.db.migrations.executor import MigrationExecutor

    MigrationExecutor(connection).migrate(targets)


def latest() -> list[tuple[str, str]]:
    from django.db.migrations.executor import MigrationExecutor

    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.fixture
def at_latest_afterwards():
    yield
    migrate(latest())


@pytest.mark.django_db(transaction=True)
def test_the_migration_chains_the_events_of_existing_runs(at_latest_afterwards):
    from django.db.migrations.executor import MigrationExecutor

    staff = UserFactory()
    migrate([BEFORE_THE_LEDGER])
    old = MigrationExecutor(connection).loader.project_state([BEFORE_THE_LEDGER]).apps
    Configuration = old.get_model("agentruns", "AgentConfiguration")
    Run = old.get_model("agentruns", "AgentRun")
    Event = old.get_model("agentruns", "AgentRunEvent")
    configuration = Configuration.objects.create(slug="old", name="old")
    with_events = Run.objects.create(configuration=configuration, prompt="p", status="completed")
    without = Run.objects.create(configuration=configuration, prompt="q", status="queued")
    payloads = [{"action": "claimed"}, {"n": 1e16, "ratio": 0.5}, {"approved": True}]
    for sequence, payload in enumerate(payloads):
        Event.objects.create(
            run=with_events,
            sequence=sequence,
            kind="approval" if sequence == 2 else "lease",
            segment="worker:old:1",
            lease_epoch=1,
            payload=payload,
            actor_id=staff.pk if sequence == 2 else None,
        )

    migrate(latest())

    report = audit.verify()
    assert (report.runs, report.events, report.intact) == (2, 3, True)
    assert AgentRun.objects.get(pk=without.pk).ledger_head == ledger.genesis(without.uuid)
    events = stream(AgentRun.objects.get(pk=with_events.pk))
    assert events[0].prev_hash == ledger.genesis(with_events.uuid)
    assert events[2].actor_ref == staff.pk
    assert AgentRun.objects.get(pk=with_events.pk).ledger_head == events[-1].hash
    # A run created after the migration continues the same way.
    assert verify("--run", str(approved_run().uuid))[0] == 0
