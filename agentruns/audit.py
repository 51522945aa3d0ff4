"""Reading the ledger (``agentruns.ledger``): verifying runs' chains and exporting a run's audit
trail as JSON Lines. Read-only: nothing here writes.

Verification walks runs in batches and each batch's events as a stream ordered by run and
sequence, so memory does not grow with the table. A run is intact when its events are numbered
0, 1, 2… without a gap, each one's ``prev_hash`` is the hash before it (the genesis value for the
first), each one's ``hash`` is what its fields give, its ``actor`` is the recorded one (or null:
the account was deleted) and the run's head is the last hash. The first bad sequence is named
with what is wrong there:

* ``missing`` — a sequence number is absent (an event was deleted);
* ``changed`` — the event's fields do not give its hash (changed in place), or its predecessor was
  rewritten with a fresh hash (its link no longer matches);
* ``reordered`` — neither its fields nor its link fit its place: it belongs elsewhere in the chain
  (events swapped or renumbered);
* ``head mismatch`` — the events are intact but the run's head does not name the last one (the
  last events were removed, or the head was altered); the sequence is the one after the last.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils.dateparse import parse_datetime

from agentruns import ledger
from agentruns.models import AgentRun, AgentRunEvent

RUNS_PER_BATCH = 200
EVENTS_PER_FETCH = 2000

MISSING = "missing"
CHANGED = "changed"
REORDERED = "reordered"
HEAD_MISMATCH = "head mismatch"
NOT_KEYED = "not keyed"
DOWNGRADED = "downgraded"

_EVENT_VALUES = (
    "run_id",
    "sequence",
    "kind",
    "payload_text",
    "segment",
    "lease_epoch",
    "actor_id",
    "actor_ref",
    "prev_hash",
    "hash",
    "created_at",
    "duration_ms",
    "ledger_version",
    "ledger_key",
)


@dataclass(frozen=True)
class Break:
    """The first place a run's chain does not hold."""

    run_uuid: UUID
    sequence: int
    problem: str

    def line(self) -> str:
        return f"{self.run_uuid}: broken at sequence {self.sequence} ({self.problem})"


@dataclass
class Report:
    """What ``verify`` found. ``key``: the key it verified keyed events under (``None``: no key
    configured); ``keyed``, ``plain``, ``legacy``: how many events it checked of each kind
    (keyed version 2, unkeyed version 2, version 1); ``needs_key``: keyed events were met with
    no key configured; ``wrong_key``: the key ids keyed events name that are not the key's."""

    runs: int = 0
    events: int = 0
    broken: list[Break] = field(default_factory=list)
    key: ledger.LedgerKey | None = None
    keyed: int = 0
    plain: int = 0
    legacy: int = 0
    needs_key: bool = False
    wrong_key: set[str] = field(default_factory=set)

    @property
    def intact(self) -> bool:
        return not self.broken and self.verifiable

    @property
    def verifiable(self) -> bool:
        """Whether every keyed event could be checked (a key was given and it is theirs)."""
        return not self.needs_key and not self.wrong_key

    @property
    def mode(self) -> str:
        if self.key is None:
            return "mode: plain SHA-256 (no AGENTRUNS_LEDGER_KEY: a keyed event cannot be checked)"
        return f"mode: keyed HMAC-SHA256 under the key {self.key.id} (AGENTRUNS_LEDGER_KEY)"

    @property
    def counts(self) -> str:
        parts = [
            f"{count} {name}"
            for count, name in (
                (self.keyed, "keyed"),
                (self.plain, "plain"),
                (self.legacy, "version 1 (before created_at and duration_ms were covered)"),
            )
            if count
        ]
        return f" ({', '.join(parts)})" if parts else ""

    def summary(self) -> str:
        if self.broken:
            return f"{len(self.broken)} of {self.runs} runs broken ({self.events} events read)"
        return f"{self.runs} runs, {self.events} events intact{self.counts}"


class _Walk:
    """One run's chain, fed its events in stored order."""

    def __init__(self, run_uuid: UUID, head: str, report: Report, *, allow_plain: bool) -> None:
        self.run_uuid = run_uuid
        self.text_uuid = str(run_uuid)
        self.stored_head = head
        self.head = ledger.genesis(run_uuid)
        self.expected = 0
        self.broken: Break | None = None
        self.report = report
        self.allow_plain = allow_plain or report.key is None
        # The format and keying so far: never going back.
        self.version = ledger.LEGACY_VERSION
        self.was_keyed = False
        self.halted = False  # a keyed event that cannot be checked: the rest neither

    def _fail(self, sequence: int, problem: str) -> None:
        self.broken = Break(self.run_uuid, sequence, problem)

    def _key_for(self, version: int, key_id: str) -> tuple[ledger.LedgerKey | None, str | None]:
        """The key to check a ``version``/``key_id`` event with, or a problem (a break)."""
        report = self.report
        if version not in ledger.VERSIONS or (version == ledger.LEGACY_VERSION and key_id):
            return None, CHANGED
        if version < self.version or (self.was_keyed and not key_id):
            return None, DOWNGRADED
        if key_id:
            if report.key is None:
                report.needs_key = True
                self.halted = True
                return None, None
            if key_id != report.key.id:
                report.wrong_key.add(key_id)
                self.halted = True
                return None, None
            return report.key, None
        if not self.allow_plain:
            return None, NOT_KEYED
        return None, None

    def feed(self, row: tuple[Any, ...]) -> None:
        if self.broken is not None or self.halted:
            return
        (_, sequence, kind, text, segment, epoch, actor_id, actor_ref, prev, stored) = row[:10]
        created_at, duration_ms, version, key_id = row[10:]
        if sequence != self.expected:
            self._fail(self.expected, MISSING)
            return
        key, problem = self._key_for(version, key_id or "")
        if self.halted:
            return
        if problem is not None:
            self._fail(sequence, problem)
            return
        try:
            payload = ledger.payload_from_text(text)
        except (TypeError, ValueError):
            payload = None  # not JSON: it cannot give its hash
        computed = ledger.event_hash(
            prev,
            run_uuid=self.text_uuid,
            sequence=sequence,
            kind=kind,
            payload=payload,
            segment=segment,
            lease_epoch=epoch,
            actor_id=actor_ref,
            version=version,
            created_at=_stored_moment(created_at),
            duration_ms=duration_ms,
            key=key,
            normalised=True,
        )
        fits = computed == stored and actor_id in (None, actor_ref)
        if prev != self.head:
            # The link is broken: an intact event after a rewritten one, or one out of place.
            if fits:
                self._fail(max(sequence - 1, 0), CHANGED)
            else:
                self._fail(sequence, REORDERED)
            return
        if not fits:
            self._fail(sequence, CHANGED)
            return
        self.version, self.was_keyed = version, key is not None
        if key is not None:
            self.report.keyed += 1
        elif version == ledger.LEGACY_VERSION:
            self.report.legacy += 1
        else:
            self.report.plain += 1
        self.head = stored
        self.expected += 1

    def finish(self) -> Break | None:
        if self.halted:
            return None  # not checked: the report refuses to verify (needs_key / wrong_key)
        # A run created outside the transitions with no event may have no head at all.
        unwritten = self.stored_head == "" and self.expected == 0
        if self.broken is None and self.stored_head != self.head and not unwritten:
            self._fail(self.expected, HEAD_MISMATCH)
        return self.broken


def _stored_moment(raw: Any) -> datetime | None:
    """``created_at`` as the driver gave it (SQLite: text; PostgreSQL: a datetime) as the value
    the writer chained: aware in UTC when the project uses time zones."""
    if raw is None:
        return None
    moment = parse_datetime(raw) if isinstance(raw, str) else raw
    if moment is None:
        return None
    if settings.USE_TZ and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def verify(
    *,
    run_uuid: UUID | str | None = None,
    since: datetime | None = None,
    allow_plain: bool = False,
) -> Report:
    """Verify every run's chain (or one run's, or those updated since ``since``), keyed events
    under the configured key (``ledger.configured_key``; raises ``LedgerKeyUnavailable`` when
    one is configured but cannot be read). With a key configured an unkeyed event is a break
    (``not keyed``) unless ``allow_plain`` (events written before the key was set)."""
    key = ledger.configured_key()
    runs = AgentRun.objects.order_by("pk")
    if run_uuid is not None:
        runs = runs.filter(uuid=run_uuid)
    if since is not None:
        runs = runs.filter(updated_at__gte=since)
    report = Report(key=key)
    last_pk = 0
    while True:
        batch = list(
            runs.filter(pk__gt=last_pk).values_list("pk", "uuid", ledger.HEAD_FIELD)[
                :RUNS_PER_BATCH
            ]
        )
        if not batch:
            return report
        last_pk = batch[-1][0]
        walks = {pk: _Walk(uuid, head, report, allow_plain=allow_plain) for pk, uuid, head in batch}
        events = (
            AgentRunEvent.objects.filter(run_id__in=list(walks))
            .order_by("run_id", "sequence")
            # The stored text, parsed once by ``ledger.payload_from_text`` (not by the field).
            .annotate(payload_text=Cast("payload", TextField()))
            .values_list(*_EVENT_VALUES)
        )
        # The server-side cursor lives and dies in this transaction (read-only work), so it
        # never outlives it: behind a transaction-mode pooler every fetch meets the server
        # session that declared it.
        with transaction.atomic():
            for row in _raw_rows(events):
                walks[row[0]].feed(row)
                report.events += 1
        for walk in walks.values():
            report.runs += 1
            broken = walk.finish()
            if broken is not None:
                report.broken.append(broken)


def _raw_rows(queryset: QuerySet[Any, Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of ``queryset`` as the database driver gives them, fetched in chunks through
    a server-side cursor where the backend has one: no per-row conversion, flat memory. Read
    them inside a transaction (``verify``): in autocommit Django declares the cursor ``WITH
    HOLD``, which outlives its transaction and so needs the same server session for every
    fetch."""
    sql, params = queryset.query.sql_with_params()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(EVENTS_PER_FETCH):
            yield from rows


# --- Export --------------------------------------------------------------------------------------


def export_lines(run: AgentRun) -> Iterator[str]:
    """A run's audit trail as JSON Lines: a ``run`` line (uuid, status, the head, how many
    events, the format), then one ``event`` line per event up to the one the head names, each
    with what its hash covers (its format ``v`` and key id ``key`` too) and its ``prev_hash`` and
    ``hash``. Events appended after the head was read are left out, so the file is one
    consistent prefix of the chain.

    The events are read in pages of ``EVENTS_PER_FETCH`` by sequence, each page its own query:
    flat memory, and nothing held open on the server while the client downloads (no cursor, no
    transaction), so the export works the same behind a transaction-mode pooler."""
    head = getattr(run, ledger.HEAD_FIELD) or ledger.genesis(run.uuid)
    count = (
        AgentRunEvent.objects.filter(run_id=run.pk, hash=head)
        .values_list("sequence", flat=True)
        .first()
    )
    events = AgentRunEvent.objects.filter(run_id=run.pk).order_by("sequence")
    if count is not None:
        events = events.filter(sequence__lte=count)
        total = count + 1
    else:
        # No event is the head: every event there is now, and none appended later.
        last = events.aggregate(last=Max("sequence"))["last"]
        events = events.filter(sequence__lte=-1 if last is None else last)
        total = events.count()
    yield _line(
        {
            "type": "run",
            "format": f"leasehold-ledger-v{ledger.VERSION}",
            "run": str(run.uuid),
            "status": run.status,
            "head": head,
            "events": total,
        }
    )
    rows = events.values_list(
        "sequence",
        "kind",
        "payload",
        "segment",
        "lease_epoch",
        "actor_ref",
        "prev_hash",
        "hash",
        "duration_ms",
        "created_at",
        "ledger_version",
        "ledger_key",
    )
    for row in _pages(rows):
        sequence, kind, payload, segment, epoch, actor_ref, prev, stored, ms, at, v, key = row
        yield _line(
            {
                "type": "event",
                "run": str(run.uuid),
                "sequence": sequence,
                "kind": kind,
                "payload": payload,
                "segment": segment,
                "lease_epoch": epoch,
                "actor": actor_ref,
                "prev_hash": prev,
                "hash": stored,
                "duration_ms": ms,
                "created_at": ledger.timestamp_text(at),
                "v": v,
                "key": key,
            }
        )


def _pages(rows: QuerySet[Any, Any]) -> Iterator[tuple[Any, ...]]:
    """``rows`` (ordered by sequence, the sequence first) in pages of ``EVENTS_PER_FETCH``."""
    after: int | None = None
    while True:
        page = list((rows if after is None else rows.filter(sequence__gt=after))[:EVENTS_PER_FETCH])
        yield from page
        if len(page) < EVENTS_PER_FETCH:
            return
        after = page[-1][0]


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n"


def export_filename(run: AgentRun) -> str:
    return f"run-{run.uuid}-audit.jsonl"
