"""The ledger covers every column an event stores — when it was written (``created_at``) and how
long it took (``duration_ms``) too — and may be keyed: with ``AGENTRUNS_LEDGER_KEY`` naming a
``LEASEHOLD_`` variable that holds a key, the chain is an HMAC-SHA256 under it, so whoever can
write the table cannot recompute it. ``verify_ledger`` names the mode it checked in and refuses
to verify a keyed ledger without its key or with another one. On SQLite and PostgreSQL alike."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from agentruns import ledger
from agentruns.exceptions import LedgerKeyUnavailable
from agentruns.models import AgentRun, AgentRunEvent
from agentruns.services import runs
from agentruns.system_checks import check_ledger_key
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.ledger import (
    PLAIN_MODE,
    approved_run,
    export,
    readme_script,
    run_script,
    sql,
    stream,
    verify,
)

pytestmark = pytest.mark.django_db

VARIABLE = "LEASEHOLD_TEST_LEDGER_KEY"
KEY = "a-ledger-key-of-forty-characters-000000"
OTHER_KEY = "another-ledger-key-of-forty-characters-0"
TABLE = AgentRunEvent._meta.db_table


def keyed_with(variable: str = VARIABLE) -> override_settings:
    return override_settings(AGENTRUNS={**settings.AGENTRUNS, "LEDGER_KEY": variable})


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> Iterator[ledger.LedgerKey]:
    """The ledger keyed with ``KEY`` for the test."""
    monkeypatch.setenv(VARIABLE, KEY)
    with keyed_with():
        yield ledger.key_of(KEY)


def keyed_mode(key: ledger.LedgerKey) -> str:
    return f"mode: keyed HMAC-SHA256 under the key {key.id} (AGENTRUNS_LEDGER_KEY)\n"


def with_duration(run: AgentRun) -> AgentRunEvent:
    (tool,) = [e for e in stream(run) if e.kind == "tool"]
    assert tool.duration_ms is not None
    return tool


# --- Every column ---------------------------------------------------------------------------------


def test_a_created_at_changed_by_sql_is_named_at_its_event():
    run, other = approved_run(), approved_run()
    target = stream(run)[2]
    sql(
        f"UPDATE {TABLE} SET created_at = %s WHERE id = %s",
        [target.created_at - timedelta(hours=3), target.pk],
    )
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence 2 (changed)" in output
    assert str(other.uuid) not in output


def test_a_created_at_moved_by_a_microsecond_is_named():
    run = approved_run()
    target = stream(run)[1]
    moved = target.created_at + timedelta(microseconds=1)
    AgentRunEvent.objects.filter(pk=target.pk).update(created_at=moved)
    assert f"{run.uuid}: broken at sequence 1 (changed)" in verify()[1]


def test_a_duration_changed_by_sql_is_named_at_its_event():
    run = approved_run()
    tool = with_duration(run)
    sql(f"UPDATE {TABLE} SET duration_ms = %s WHERE id = %s", [tool.duration_ms + 1, tool.pk])
    code, output = verify()
    assert code == 1
    assert f"{run.uuid}: broken at sequence {tool.sequence} (changed)" in output
    sql(f"UPDATE {TABLE} SET duration_ms = NULL WHERE id = %s", [tool.pk])
    assert f"broken at sequence {tool.sequence} (changed)" in verify()[1]


def test_a_format_or_key_column_changed_by_sql_is_named():
    run = approved_run()
    target = stream(run)[3]
    AgentRunEvent.objects.filter(pk=target.pk).update(ledger_version=1)
    assert f"{run.uuid}: broken at sequence 3 (downgraded)" in verify()[1]
    AgentRunEvent.objects.filter(pk=target.pk).update(ledger_version=7)
    assert f"{run.uuid}: broken at sequence 3 (changed)" in verify()[1]


def test_the_timestamp_text_is_utc_with_six_digits_of_microseconds():
    event = stream(approved_run())[0]
    text = ledger.timestamp_text(event.created_at)
    assert (
        text is not None and text.endswith("Z") and len(text) == len("2026-12-01T00:00:00.000000Z")
    )
    read_back = AgentRunEvent.objects.get(pk=event.pk).created_at
    assert ledger.timestamp_text(read_back) == text  # the database keeps every microsecond


# --- Keyed ----------------------------------------------------------------------------------------


def test_a_keyed_chain_verifies_under_its_key_and_says_so(key):
    run = approved_run()
    events = stream(run)
    assert {(e.ledger_version, e.ledger_key) for e in events} == {(ledger.VERSION, key.id)}
    count = len(events)
    assert verify(mode=keyed_mode(key)) == (
        0,
        f"1 runs, {count} events intact ({count} keyed)\n",
    )


def rechain_plainly(run: AgentRun, *, clear_key: bool) -> None:
    """What someone who can write the table but has no key does after changing an event: every
    hash recomputed with the published (unkeyed) format, and the head."""
    head = ledger.genesis(run.uuid)
    for event in stream(run):
        key_id = "" if clear_key else event.ledger_key
        digest = ledger.link(
            head,
            ledger.canonical(
                run_uuid=str(run.uuid),
                sequence=event.sequence,
                kind=event.kind,
                payload=ledger.canonical_payload(event.payload),
                segment=event.segment,
                lease_epoch=event.lease_epoch,
                actor_id=event.actor_ref,
                created_at=event.created_at,
                duration_ms=event.duration_ms,
                key_id=key_id,
            ),
        )
        AgentRunEvent.objects.filter(pk=event.pk).update(
            prev_hash=head, hash=digest, ledger_key=key_id
        )
        head = digest
    AgentRun.objects.filter(pk=run.pk).update(ledger_head=head)


@pytest.mark.parametrize(
    ("clear_key", "problem"),
    [(False, "changed"), (True, "not keyed")],
    ids=["key-id-kept", "key-id-cleared"],
)
def test_a_keyed_chain_recomputed_without_the_key_does_not_verify(key, clear_key, problem):
    run, other = approved_run(), approved_run()
    target = stream(run)[3]
    AgentRunEvent.objects.filter(pk=target.pk).update(payload={"forged": True})
    rechain_plainly(run, clear_key=clear_key)

    code, output = verify(mode=keyed_mode(key))

    assert code == 1
    assert f"{run.uuid}: broken at sequence 0 ({problem})" in output
    assert str(other.uuid) not in output and "1 of 2 runs broken" in output
    # Without the key it would have passed: that is what the key adds.
    if clear_key:
        with keyed_with(""):
            assert verify("--run", str(run.uuid))[0] == 0


def test_a_keyed_run_downgraded_to_plain_is_refused_even_when_plain_events_are_allowed(key):
    run = approved_run()
    last = stream(run)[-1]
    digest = ledger.link(
        last.prev_hash,
        ledger.canonical(
            run_uuid=str(run.uuid),
            sequence=last.sequence,
            kind=last.kind,
            payload=ledger.canonical_payload(last.payload),
            segment=last.segment,
            lease_epoch=last.lease_epoch,
            actor_id=last.actor_ref,
            created_at=last.created_at,
            duration_ms=last.duration_ms,
        ),
    )
    AgentRunEvent.objects.filter(pk=last.pk).update(hash=digest, ledger_key="")
    AgentRun.objects.filter(pk=run.pk).update(ledger_head=digest)

    code, output = verify("--allow-plain", mode=keyed_mode(key))

    assert code == 1 and f"broken at sequence {last.sequence} (downgraded)" in output


def test_plain_events_from_before_the_key_verify_only_when_allowed(monkeypatch):
    before = approved_run()  # written without a key
    monkeypatch.setenv(VARIABLE, KEY)
    with keyed_with():
        after = approved_run()
        key = ledger.key_of(KEY)
        code, output = verify(mode=keyed_mode(key))
        assert code == 1 and f"{before.uuid}: broken at sequence 0 (not keyed)" in output
        assert str(after.uuid) not in output
        plain, keyed = len(stream(before)), len(stream(after))
        assert verify("--allow-plain", mode=keyed_mode(key)) == (
            0,
            f"2 runs, {plain + keyed} events intact ({keyed} keyed, {plain} plain)\n",
        )


def test_a_keyed_ledger_without_its_key_is_refused_clearly(key):
    run = approved_run()
    with keyed_with(""):
        code, output = verify()
    assert code == 3
    assert "the ledger is keyed (HMAC-SHA256) and no key is configured" in output
    assert "intact" not in output
    assert AgentRun.objects.get(pk=run.pk).status == "completed"


def test_a_keyed_ledger_with_the_wrong_key_is_refused_clearly(key, monkeypatch):
    approved_run()
    monkeypatch.setenv(VARIABLE, OTHER_KEY)
    other = ledger.key_of(OTHER_KEY)
    code, output = verify(mode=keyed_mode(other))
    assert code == 3
    assert f"chained under the key {key.id}, not under the configured key {other.id}" in output
    assert KEY not in output and OTHER_KEY not in output  # never the key itself


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (VARIABLE, None, "which is not set or empty"),
        (VARIABLE, "short", "shorter than 32 characters"),
        ("DATABASE_URL", KEY, "may not hold a secret"),
    ],
    ids=["unset", "short", "not-a-leasehold-variable"],
)
def test_a_key_that_cannot_be_read_writes_no_event_and_fails_the_checks(
    monkeypatch, variable, value, said
):
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    configuration = AgentConfigurationFactory(tools=[], script=[{"content": "hi"}])
    with keyed_with(variable):
        (error,) = check_ledger_key()
        assert error.id == "agentruns.E010" and said in error.msg
        with pytest.raises(LedgerKeyUnavailable, match=said):
            runs.run_start_sync(configuration=configuration, prompt="go")
        assert not AgentRun.objects.exists() and not AgentRunEvent.objects.exists()
        code, output = verify(mode="mode: keyed HMAC-SHA256 (AGENTRUNS_LEDGER_KEY)\n")
        assert code == 3 and said in output
    assert check_ledger_key() == []


def test_the_readme_script_verifies_a_keyed_export_given_its_key(key, tmp_path: Path):
    run = approved_run()
    exported = export(run, tmp_path)
    script = readme_script(tmp_path)

    without = run_script(script, exported)
    assert without.returncode == 1 and f"keyed under {key.id}" in without.stderr

    import subprocess
    import sys

    checked = subprocess.run(
        [sys.executable, "-I", str(script), str(exported), VARIABLE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    count = len(stream(run))
    assert checked.returncode == 0, checked.stderr
    assert f"{count} events intact ({count} keyed)" in checked.stdout


def test_the_plain_mode_is_named_when_no_key_is_configured():
    approved_run()
    code, output = verify(mode=PLAIN_MODE)
    assert code == 0 and "intact" in output
    call_command("check")  # no key: nothing to report
