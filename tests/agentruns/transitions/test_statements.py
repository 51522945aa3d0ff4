"""The transitions' named statements (``agentruns/transitions/sql``): one file per database with
the same names, each statement whole, guarded, its literals the vocabulary's, every one used —
and the writer that executes them returns the row as the statement returned it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentruns.models import ApprovalTimeoutAction, EventKind, Status, TerminationReason
from agentruns.models.choices import Effect
from agentruns.transitions import _statements, run_suspend
from agentruns.transitions._statements import VENDORS, of_vendor, parse
from tests.agentruns.support.transitions import approval_turn, start

TRANSITIONS = Path(_statements.__file__).parent

#: ``column = 'literal'`` and ``column IN ('a', 'b')`` in a statement, for the columns whose
#: values are a vocabulary.
LITERALS = re.compile(
    r"\b(status|termination_reason|pending_effect|approval_timeout_action)\s*(?:=|<>|IN)\s*"
    r"(\('[^)]*'\)|'[^']*')",
    re.IGNORECASE,
)
VOCABULARY = {
    "status": set(Status.values),
    "termination_reason": set(TerminationReason.values),
    "pending_effect": {"", *Effect.values},
    "approval_timeout_action": {"", *ApprovalTimeoutAction.values},
}


def test_every_database_has_the_same_statements():
    names = {vendor: set(of_vendor(vendor)) for vendor in VENDORS}
    assert names["postgresql"] == names["sqlite"]
    assert len(names["sqlite"]) > 20


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_guarded_statement_has_its_guard_in_its_text(vendor):
    for name, sql in of_vendor(vendor).items():
        if name == "append_events":
            continue  # an INSERT of events, in the transaction of a guarded write
        if name == "lock_waiting_run":
            continue  # a decision's read under the row lock, before its guarded write
        assert re.search(r"\bUPDATE agentruns_agentrun\b", sql), name
        assert re.search(r"\bWHERE (run\.)?(id|uuid) = ", sql), name


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_literals_of_the_statements_are_the_vocabulary_s(vendor):
    for name, sql in of_vendor(vendor).items():
        for column, literal in LITERALS.findall(sql):
            values = set(re.findall(r"'([^']*)'", literal))
            assert values <= VOCABULARY[column.lower()], (name, column, values)


def test_every_statement_is_named_by_a_transition():
    source = "\n".join(path.read_text() for path in TRANSITIONS.glob("*.py"))
    unused = [name for name in of_vendor("sqlite") if f'"{name}"' not in source]
    assert unused == []


def test_a_file_is_parsed_into_its_statements_without_their_comments():
    text = (
        "-- a header for the reader --- not a statement\n\n"
        "-- first --\n-- what it writes.\n-- Guard: none.\nUPDATE t\n   SET a = 1;\n\n"
        "-- A group of statements.\n\n"
        "-- second --\n-- what it writes.\nUPDATE t SET b = %(b)s\n"
    )
    assert parse(text) == {"first": "UPDATE t\n   SET a = 1", "second": "UPDATE t SET b = %(b)s"}
    with pytest.raises(ValueError, match="twice"):
        parse("-- one --\nSELECT 1;\n-- one --\nSELECT 2;\n")


@pytest.mark.django_db
def test_the_writer_returns_the_row_as_the_statement_returned_it():
    """The suspend hands the parked row to the runtime: its columns as written, read from the
    statement's own ``RETURNING`` (no query after it)."""
    lease = start()
    with CaptureQueriesContext(connection) as captured:
        parked = run_suspend(
            lease,
            status=Status.WAITING_FOR_APPROVAL,
            pending_turn=approval_turn(),
            loop_state={"iteration": 1},
        )
        written = len(captured.captured_queries)
        assert parked is not None
        assert (parked.pk, parked.status, parked.claimed_by) == (
            lease.run_id,
            Status.WAITING_FOR_APPROVAL,
            "",
        )
        assert parked.pending_turn == approval_turn().to_json()
        assert parked.loop_state == {"iteration": 1}
        assert parked.updated_at is not None and parked.lease_expires is None
        assert len(captured.captured_queries) == written  # nothing read back
    assert parked.uuid == lease.uuid
    assert str(EventKind.LEASE) in {e.kind for e in parked.events.all()}
