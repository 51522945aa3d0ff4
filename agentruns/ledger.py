"""The tamper-evident ledger: how a run's events are chained and where the chain's head lives
(docs/design.md §15).

Every event carries ``prev_hash`` (the hash of the run's previous event, or the run's genesis
value for its first) and ``hash``: SHA-256 over the previous hash and the canonical JSON of the
event's run uuid, sequence, kind, payload, segment, lease epoch and actor. The run row keeps the
head (``AgentRun.ledger_head``, the last event's hash; the genesis value while it has none),
written by the writer (``agentruns.transitions._writer``) in the same guarded statement or
transaction as the events, so removing the last events is detected too.

This module is the only place that knows the format and the head column: the writer asks it for
the links of the events it appends (``chain``) and writes ``HEAD_FIELD`` with them; the audit
(``agentruns.audit``) recomputes them. Free of queries but ``read_tail`` / ``write_tail``.

The format is version 1; a standalone verifier needs only this (README, "Verifying an export"):

* ``genesis(uuid) = sha256("leasehold-ledger-v1:" + uuid)`` (hex, lowercase uuid with hyphens);
* ``hash = sha256(prev_hash + canonical)`` (both as ASCII text), where ``canonical`` is
  ``json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` of
  ``{"run": uuid, "sequence", "kind", "payload", "segment", "lease_epoch", "actor"}`` (``actor``
  the deciding user's id or null) with every float that is a whole number written as an integer
  (PostgreSQL's ``jsonb`` gives ``1e16`` back as ``10000000000000000``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, NamedTuple
from uuid import UUID

from agentruns.leases import EventSpec

VERSION = 1
GENESIS_PREFIX = "leasehold-ledger-v1:"
#: The run column holding the chain's head.
HEAD_FIELD = "ledger_head"
HASH_LENGTH = 64


def genesis(run_uuid: UUID | str) -> str:
    """The value a run's first event chains from (and the head of a run with no events)."""
    return hashlib.sha256(f"{GENESIS_PREFIX}{str(run_uuid).lower()}".encode("ascii")).hexdigest()


def _json_key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it (and so as the database gives it back)."""
    if key is True or key is False or key is None:
        return json.dumps(key)
    return key if isinstance(key, str) else str(json.loads(json.dumps(key)))


def _normalised(value: Any) -> Any:
    """``value`` as it reads back from either database after a JSON round trip — tuples as
    lists, keys as strings — with whole floats as integers. One walk, no serialising: this runs
    for every event a boundary appends, so a dict's or a list's plain items (strings, integers,
    booleans, null: most of a payload) are taken as they are, without a call each."""
    kind = type(value)
    if kind is dict:
        out = {}
        for key, item in value.items():
            plain = type(item)
            if not (plain is str or plain is int or plain is bool or item is None):
                item = _normalised(item)
            out[key if type(key) is str else _json_key(key)] = item
        return out
    if kind is list or kind is tuple:
        return [
            item
            if (type(item) is str or type(item) is int or type(item) is bool or item is None)
            else _normalised(item)
            for item in value
        ]
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is str or kind is int or kind is bool or value is None:
        return value
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
) -> str:
    """The canonical JSON text of one event (``payload`` already canonical)."""
    return _encode(
        {
            "run": run_uuid.lower() if isinstance(run_uuid, str) else str(run_uuid),
            "sequence": sequence,
            "kind": str(kind),
            "payload": payload,
            "segment": segment,
            "lease_epoch": lease_epoch,
            "actor": actor_id,
        }
    )


def link(prev_hash: str, canonical_text: str) -> str:
    """``sha256(prev_hash + canonical_text)``, hex."""
    return hashlib.sha256((prev_hash + canonical_text).encode("ascii")).hexdigest()


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
    normalised: bool = False,
) -> str:
    """The hash of an event as stored (``payload`` as read back from the database; already
    canonical with ``normalised``, e.g. from ``payload_from_text``)."""
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
        ),
    )


class Link(NamedTuple):
    """One appended event's place in the chain (a tuple: built for every event appended)."""

    prev_hash: str
    hash: str


def chain(
    *,
    run_uuid: UUID | str,
    prev_hash: str,
    first_sequence: int,
    segment: str,
    lease_epoch: int,
    events: Iterable[EventSpec],
) -> tuple[list[Link], str]:
    """The links of ``events`` appended after ``prev_hash``, numbered from ``first_sequence``
    and signed ``segment``/``lease_epoch``; and the new head."""
    links = []
    head = prev_hash
    sha256 = hashlib.sha256
    new_link = tuple.__new__
    c_encode = _c_encode
    # ``canonical`` and ``link``, inlined (this runs for every event a boundary appends): the
    # record's keys in sorted order around the parts that change from event to event, the
    # payload encoded by the same C encoder with the same options. ``test_ledger`` holds it
    # equal to ``canonical``.
    middle, tail = _signer_parts(run_uuid, segment, lease_epoch)
    for sequence, spec in enumerate(events, start=first_sequence):
        actor = spec.actor_id
        kind = spec.kind
        payload = _normalised(spec.payload)
        text = (
            f'{{"actor":{"null" if actor is None else _scalar(actor)},'
            f'"kind":{_KIND_TEXT.get(kind) or _kind_text(kind)}{middle}'
            f"{''.join(c_encode(payload, 0)) if c_encode else _encode(payload)}{tail}{sequence}}}"
        )
        current = sha256((head + text).encode("ascii")).hexdigest()
        links.append(new_link(Link, (head, current)))
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
