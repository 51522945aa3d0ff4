"""The tamper-evident ledger: how a run's events are chained and where the chain's head lives
(docs/design.md §15).

Every event carries ``prev_hash`` (the hash of the run's previous event, or the run's genesis
value for its first) and ``hash`` over the previous hash and the canonical JSON of every column
the event stores: its run, sequence, kind, payload, segment, lease epoch, actor, ``created_at``
and ``duration_ms``, and the format (``ledger_version``) and key (``ledger_key``) it was chained
with. With ``AGENTRUNS_LEDGER_KEY`` set (the name of a secret environment variable, README "The
ledger") the hash is an HMAC-SHA256 under that key: writing the table is then not enough to
forge a chain. The run row keeps the head (``AgentRun.ledger_head``, the last event's hash; the
genesis value while it has none), written by the writer (``agentruns.transitions._writer``) in
the same guarded statement or transaction as the events, so removing the last events is detected
too.

This module is the only place that knows the format, the key and the head column: the writer
asks it for the links of the events it appends (``chain``) and writes ``HEAD_FIELD`` with them;
the audit (``agentruns.audit``) recomputes them. Free of queries but ``read_tail`` /
``write_tail``.

The formats; a standalone verifier needs only this (README, "Verifying an export"):

* ``genesis(uuid) = sha256("leasehold-ledger-v1:" + uuid)`` (hex, lowercase uuid with hyphens);
* ``hash = H(prev_hash + canonical)`` (both as ASCII text), where ``canonical`` is
  ``json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``, every float
  in the payload that is a whole number written as an integer (PostgreSQL's ``jsonb`` gives
  ``1e16`` back as ``10000000000000000``);
* version 2 (every event written now): ``record = {"run": uuid, "sequence", "kind", "payload",
  "segment", "lease_epoch", "actor", "created_at", "duration_ms", "key", "v": 2}`` — ``actor``
  the deciding user's id or null, ``created_at`` the app server's clock in UTC as
  ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (always six digits; without ``Z`` when the project runs with
  ``USE_TZ = False``, then its local time as stored), ``duration_ms`` an integer or null,
  ``key`` the key id (``""`` unkeyed). ``H`` is SHA-256 unkeyed, HMAC-SHA256 under the key
  keyed; the key id is the first 16 hex digits of ``HMAC-SHA256(key, "leasehold-ledger-key-id")``
  (it names the key, and tells a wrong key from a changed event);
* version 1 (events written before version 2 existed; they keep their hashes):
  ``record = {"run", "sequence", "kind", "payload", "segment", "lease_epoch", "actor"}``,
  ``H`` SHA-256. A run's events never go back from version 2 to 1, nor from keyed to unkeyed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings

from agentruns import conf
from agentruns.exceptions import LedgerKeyUnavailable, SecretEnvRefused
from agentruns.leases import EventSpec
from agentruns.secrets import read_secret_env

#: The format every event is chained in now; ``LEGACY_VERSION``: events chained before it.
VERSION = 2
LEGACY_VERSION = 1
VERSIONS = (LEGACY_VERSION, VERSION)
GENESIS_PREFIX = "leasehold-ledger-v1:"
#: The run column holding the chain's head.
HEAD_FIELD = "ledger_head"
HASH_LENGTH = 64
#: The ``AGENTRUNS`` setting naming the environment variable that holds the key.
KEY_SETTING = "LEDGER_KEY"
#: The shortest key accepted (characters).
MIN_KEY_CHARS = 32
KEY_ID_LENGTH = 16
_KEY_ID_MESSAGE = b"leasehold-ledger-key-id"


# --- The key ------------------------------------------------------------------------------------


class LedgerKey(NamedTuple):
    """The ledger's key: its bytes and its id (``key_id``)."""

    secret: bytes
    id: str


def key_id(secret: bytes) -> str:
    """The id a key's events record: the first 16 hex digits of an HMAC of a fixed text (names
    the key without revealing it)."""
    return hmac.digest(secret, _KEY_ID_MESSAGE, "sha256").hex()[:KEY_ID_LENGTH]


def key_of(value: str) -> LedgerKey:
    secret = value.encode("utf-8")
    return LedgerKey(secret, key_id(secret))


_last_key: tuple[tuple[str, str], LedgerKey] | None = None


def key_problem() -> str | None:
    """Why the configured key cannot be used (unset variable, refused name, too short), or
    ``None`` (a usable key, or no key configured)."""
    try:
        configured_key()
    except LedgerKeyUnavailable as exc:
        return exc.message
    return None


def configured_key() -> LedgerKey | None:
    """The key ``AGENTRUNS_LEDGER_KEY`` names (read from that environment variable, which must
    start with one of ``AGENTRUNS_SECRET_ENV_PREFIXES``), or ``None`` when no key is configured.
    Raises ``LedgerKeyUnavailable`` when one is configured but cannot be used: fail closed, an
    event is never chained unkeyed because the key went missing. Never puts the key in a
    message."""
    global _last_key
    name = conf.app_settings().ledger_key
    if not name:
        return None
    try:
        value = read_secret_env(name, what=f"AGENTRUNS_{KEY_SETTING}")
    except SecretEnvRefused as exc:
        raise LedgerKeyUnavailable(exc.message) from None
    if not value:
        raise LedgerKeyUnavailable(
            f"AGENTRUNS_{KEY_SETTING} names {name}, which is not set or empty"
        )
    if len(value) < MIN_KEY_CHARS:
        raise LedgerKeyUnavailable(
            f"the ledger key in {name} is shorter than {MIN_KEY_CHARS} characters"
        )
    cached = _last_key
    if cached is not None and cached[0] == (name, value):
        return cached[1]
    key = key_of(value)
    _last_key = ((str(name), value), key)
    return key


# --- The record -----------------------------------------------------------------------------------


def timestamp_text(moment: datetime | None) -> str | None:
    """``created_at`` as the record holds it: UTC, ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (a naive
    value, from ``USE_TZ = False``, as it is, without the ``Z``)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.isoformat(timespec="microseconds")
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    text = moment.isoformat()  # "…T09:30:00.123456+00:00", or "…T09:30:00+00:00" (the fastest)
    return text[:-6] + ("Z" if moment.microsecond else ".000000Z")


def genesis(run_uuid: UUID | str) -> str:
    """The value a run's first event chains from (and the head of a run with no events)."""
    return hashlib.sha256(f"{GENESIS_PREFIX}{str(run_uuid).lower()}".encode("ascii")).hexdigest()


def _json_key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it (and so as the database gives it back)."""
    if key is True or key is False or key is None:
        return json.dumps(key)
    return key if isinstance(key, str) else str(json.loads(json.dumps(key)))


#: The values a JSON round trip gives back as they are (exactly these types, not subclasses).
_PLAIN = frozenset({str, int, bool, type(None)})


def _normalised(value: Any) -> Any:
    """``value`` as it reads back from either database after a JSON round trip — tuples as
    lists, keys as strings — with whole floats as integers. One walk, no serialising: this runs
    for every event a boundary appends, so a dict's or a list's plain items (strings, integers,
    booleans, null: most of a payload) are taken as they are, without a call each."""
    kind = type(value)
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(item) not in _PLAIN:
                item = _normalised(item)
            out[key if type(key) is str else _json_key(key)] = item
        return out
    if kind is list or kind is tuple:
        return [item if type(item) in _PLAIN else _normalised(item) for item in value]
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind in _PLAIN:
        return value
    return _normalised_subclass(value)


def _normalised_subclass(value: Any) -> Any:
    """``_normalised`` of an instance of a subclass of ``dict``, ``list``, ``tuple`` or
    ``float`` (as its base type); any other value as it is."""
    if isinstance(value, dict):
        return _normalised(dict(value))
    if isinstance(value, list | tuple):
        return [_normalised(item) for item in value]
    if isinstance(value, float):
        return _normalised(float(value))
    return value


def _whole_or_float(text: str) -> Any:
    number = float(text)
    return int(number) if number.is_integer() else number


_DECODER = json.JSONDecoder(parse_float=_whole_or_float)


def payload_from_text(text: str) -> Any:
    """A payload's stored JSON text parsed canonically (whole floats as integers) in one pass of
    the C parser: what the verification reads, much faster than decoding and then walking."""
    return _DECODER.decode(text)


def canonical_payload(payload: Any) -> Any:
    """The payload as the database will give it back (``_normalised``)."""
    return _normalised(payload)


# ``json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``, with the
# encoder built once (``dumps`` builds one per call when given options).
_encode = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encoder() -> Any:
    """``_encode``'s C encoder, built once instead of on every call (``JSONEncoder.iterencode``
    builds one per call): the same function given the same options, so the same text, but no
    circular-reference bookkeeping: a circular payload (which no database can store either) ends
    in ``RecursionError`` instead of ``ValueError``. ``None`` without the C accelerator."""
    if json.encoder.c_make_encoder is None:  # type: ignore[attr-defined]
        return None
    return json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True
    )


_c_encode = _c_encoder()


def _encode_payload(value: Any) -> str:
    """``_encode(value)`` (a payload already normalised) through the prebuilt C encoder."""
    if _c_encode is None:
        return _encode(value)
    return "".join(_c_encode(value, 0))


def _scalar(value: Any) -> str:
    """``_encode(value)``, without the encoder's setup for a string or an integer (the same
    functions it calls for them)."""
    kind = type(value)
    if kind is str:
        return json.encoder.encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    return _encode(value)


# The encoded kinds (``_encode(str(kind))``), looked up for every event chained: an
# ``EventKind`` finds its value's entry (a ``TextChoices`` member is equal to its value).
_KIND_TEXT: dict[str, str] = {}


def _kind_text(kind: Any) -> str:
    name = str(kind)
    text = _scalar(name)
    if name == kind and len(_KIND_TEXT) < 64:
        _KIND_TEXT[name] = text
    return text


def canonical(
    *,
    run_uuid: UUID | str,
    sequence: int,
    kind: str,
    payload: Any,
    segment: str,
    lease_epoch: int,
    actor_id: int | None,
    created_at: datetime | None = None,
    duration_ms: int | None = None,
    key_id: str = "",
    version: int = VERSION,
) -> str:
    """The canonical JSON text of one event in ``version``'s record (``payload`` already
    canonical); version 1's record has no ``created_at``, ``duration_ms``, ``key`` or ``v``."""
    record: dict[str, Any] = {
        "run": run_uuid.lower() if isinstance(run_uuid, str) else str(run_uuid),
        "sequence": sequence,
        "kind": str(kind),
        "payload": payload,
        "segment": segment,
        "lease_epoch": lease_epoch,
        "actor": actor_id,
    }
    if version != LEGACY_VERSION:
        record.update(
            created_at=timestamp_text(created_at),
            duration_ms=duration_ms,
            key=key_id,
            v=version,
        )
    return _encode(record)


def link(prev_hash: str, canonical_text: str, key: bytes | None = None) -> str:
    """``sha256(prev_hash + canonical_text)``, or its HMAC-SHA256 under ``key``; hex."""
    message = (prev_hash + canonical_text).encode("ascii")
    if key is None:
        return hashlib.sha256(message).hexdigest()
    return hmac.digest(key, message, "sha256").hex()


def event_hash(
    prev_hash: str,
    *,
    run_uuid: UUID | str,
    sequence: int,
    kind: str,
    payload: Any,
    segment: str,
    lease_epoch: int,
    actor_id: int | None,
    version: int,
    created_at: datetime | None = None,
    duration_ms: int | None = None,
    key: LedgerKey | None = None,
    normalised: bool = False,
) -> str:
    """The hash of an event as stored, in ``version``'s format (keyed under ``key`` when given:
    version 2 only). ``payload`` as read back from the database; already canonical with
    ``normalised``, e.g. from ``payload_from_text``."""
    return link(
        prev_hash,
        canonical(
            run_uuid=run_uuid,
            sequence=sequence,
            kind=kind,
            payload=payload if normalised else _normalised(payload),
            segment=segment,
            lease_epoch=lease_epoch,
            actor_id=actor_id,
            created_at=created_at,
            duration_ms=duration_ms,
            key_id=key.id if key is not None else "",
            version=version,
        ),
        key.secret if key is not None and version != LEGACY_VERSION else None,
    )


class Link(NamedTuple):
    """One appended event's place in the chain (a tuple: built for every event appended), and
    the values of the columns the chain fixed: ``created_at`` and the key id (``""`` unkeyed).
    Its format is ``VERSION``."""

    prev_hash: str
    hash: str
    created_at: datetime
    key_id: str


_UNSET: Any = object()


def chain(
    *,
    run_uuid: UUID | str,
    prev_hash: str,
    first_sequence: int,
    segment: str,
    lease_epoch: int,
    events: Iterable[EventSpec],
    created_at: datetime | None = None,
    key: LedgerKey | None = _UNSET,
) -> tuple[list[Link], str]:
    """The links of ``events`` appended after ``prev_hash``, numbered from ``first_sequence``
    and signed ``segment``/``lease_epoch``, stamped ``created_at`` (the app server's clock now
    by default: the one value the rows store) and keyed with the configured key (``key``:
    another, or ``None`` unkeyed); and the new head. Raises ``LedgerKeyUnavailable`` when a key
    is configured but cannot be read: nothing is chained unkeyed in its place."""
    if key is _UNSET:
        key = configured_key()
    # ``timezone.now()`` and ``timestamp_text`` inlined for the usual value (aware, in UTC).
    moment = created_at
    if moment is None:
        moment = datetime.now(UTC) if settings.USE_TZ else datetime.now()
    if moment.tzinfo is UTC:
        stamp = moment.isoformat()[:-6] + ("Z" if moment.microsecond else ".000000Z")
    else:
        stamp = timestamp_text(moment) or ""
    links = []
    head = prev_hash
    new_link = tuple.__new__
    c_encode = _c_encode
    key_id = key.id if key is not None else ""
    # ``canonical`` and ``link``, inlined (this runs for every event a boundary appends): the
    # record's keys in sorted order around the parts that change from event to event, the
    # payload encoded by the same C encoder with the same options. ``test_ledger`` holds it
    # equal to ``canonical``.
    middle, tail = _signer_parts(run_uuid, segment, lease_epoch)
    # The time and the key id are ASCII digits, letters and punctuation: no escaping.
    stamped = f',"created_at":"{stamp}","duration_ms":'
    keyed = f',"key":"{key_id}","kind":'
    version_tail = f',"v":{VERSION}}}'
    sha256, hmac_digest = hashlib.sha256, hmac.digest
    secret = key.secret if key is not None else None
    for sequence, spec in enumerate(events, start=first_sequence):
        actor = spec.actor_id
        kind = spec.kind
        duration = spec.duration_ms
        payload = _normalised(spec.payload)
        message = (
            f'{head}{{"actor":{"null" if actor is None else _scalar(actor)}{stamped}'
            f"{'null' if duration is None else _scalar(duration)}{keyed}"
            f"{_KIND_TEXT.get(kind) or _kind_text(kind)}{middle}"
            f"{''.join(c_encode(payload, 0)) if c_encode else _encode(payload)}{tail}{sequence}"
            f"{version_tail}"
        ).encode("ascii")
        current = (
            sha256(message).hexdigest()
            if secret is None
            else hmac_digest(secret, message, "sha256").hex()
        )
        links.append(new_link(Link, (head, current, moment, key_id)))
        head = current
    return links, head


# The record's text around the payload for the last signer chained (a segment chains every
# boundary's events under the same run, segment and epoch): ``(run_uuid, segment, epoch)`` and
# the text before and after the payload.
_last_signer: tuple[Any, tuple[str, str]] = (None, ("", ""))


def _signer_parts(run_uuid: UUID | str, segment: str, lease_epoch: int) -> tuple[str, str]:
    global _last_signer
    signer = (run_uuid, segment, lease_epoch)
    cached = _last_signer
    if cached[0] == signer and type(lease_epoch) is int and type(segment) is str:
        return cached[1]
    middle = f',"lease_epoch":{_scalar(lease_epoch)},"payload":'
    tail = f',"run":{_scalar(str(run_uuid).lower())},"segment":{_scalar(segment)},"sequence":'
    _last_signer = (signer, (middle, tail))
    return middle, tail


# --- The head (and the next sequence) on the run row ------------------------------------------

#: The run column holding the sequence its next event takes (advanced with the head).
SEQUENCE_FIELD = "next_sequence"


def read_tail(run_id: int) -> tuple[UUID, str, int]:
    """The run's uuid, stored head and next sequence, in one read (call while holding the row:
    lock, guard or lease). A run whose head was never written (``""``) chains from its genesis
    value."""
    from agentruns.models import AgentRun

    run_uuid, head, sequence = (
        AgentRun.objects.filter(pk=run_id).values_list("uuid", HEAD_FIELD, SEQUENCE_FIELD).get()
    )
    return run_uuid, head or genesis(run_uuid), sequence


def write_tail(run_id: int, head: str, next_sequence: int) -> None:
    """Store ``head`` and ``next_sequence`` on the run (in the transaction that appended the
    events they name)."""
    from agentruns.models import AgentRun

    AgentRun.objects.filter(pk=run_id).update(**{HEAD_FIELD: head, SEQUENCE_FIELD: next_sequence})
