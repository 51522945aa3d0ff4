"""Sample tools for the playground: notes, a webhook, a wait and a question to a human.

Owns only the tool bodies and their declarations; ``PlaygroundConfig.ready()`` registers
``TOOLS``. Tools never check leases or approvals (the runtime does that before calling them)
and ``agentruns`` must never import this module.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentruns.conf import app_settings
from agentruns.models import Effect
from agentruns.outbound import (
    Target,
    WebhookRefused,
    connection_for,
    resolve_target,
    webhook_target,
)
from agentruns.tools import (
    CheckAnswer,
    CheckContext,
    OutcomeUnknown,
    Tool,
    ToolContext,
    ToolRefused,
    tool,
)
from agentruns.turns import Change, Preview
from playground.models import Note

LIST_LIMIT = 100
WEBHOOK_BODY_CHARS = 2000
WAIT_MAX_SECONDS = 3600


class NoteNotFound(LookupError):
    """No note with that id."""


class DuplicateCall(ValueError):
    """A note with this call's idempotency key exists already: the call ran before."""


def _note_as_dict(note: Note) -> dict[str, Any]:
    return {
        "id": note.pk,
        "title": note.title,
        "body": note.body,
        "created_at": note.created_at.isoformat(),
        "updated_at": note.updated_at.isoformat(),
    }


def _get_note(note_id: int) -> Note:
    try:
        return Note.objects.get(pk=note_id)
    except Note.DoesNotExist:
        raise NoteNotFound(f"note {note_id} does not exist") from None


# --- Previews: what a write will change, shown to the approver (read-only) ----------------------


def preview_update_note(context: ToolContext, arguments: dict[str, Any]) -> Preview:
    """Each field it sets, from the note as it is now to what it will be."""
    note_id = arguments.get("id")
    note = Note.objects.filter(pk=note_id).first() if isinstance(note_id, int) else None
    if note is None:
        return Preview(summary=f"note {note_id} does not exist", target=f"note {note_id}")
    changes = tuple(
        Change(field=name, before=getattr(note, name), after=arguments[name])
        for name in ("title", "body")
        if name in arguments
    )
    same = all(change.before == change.after for change in changes)
    summary = f"updates note {note.pk} ({note.title!r})" + (" — no change" if same else "")
    return Preview(summary=summary, target=f"note {note.pk}", changes=changes)


def preview_create_note(context: ToolContext, arguments: dict[str, Any]) -> Preview:
    """A new note: nothing before, its title and body after."""
    return Preview(
        summary=f"creates a note titled {arguments.get('title')!r}",
        changes=(
            Change(field="title", after=arguments.get("title")),
            Change(field="body", after=arguments.get("body")),
        ),
    )


def preview_call_webhook(context: ToolContext, arguments: dict[str, Any]) -> Preview:
    """Where the request goes and what it carries; URLs refused by name say so (nothing would be
    sent). The name is resolved and its addresses checked when the call runs, not here."""
    url = str(arguments.get("url"))
    parts = urlsplit(url)
    body = json.dumps(arguments.get("payload"))
    try:
        host = webhook_target(url, list(app_settings().webhook_allowlist))
    except WebhookRefused as refused:
        return Preview(summary=f"sends nothing: {refused}", target=url)
    return Preview(
        summary=f"POST {len(body.encode('utf-8'))} bytes of JSON to {host}{parts.path or '/'}",
        target=url,
        changes=(
            Change(field="method", after="POST"),
            Change(field="host", after=host),
            Change(field="path", after=parts.path or "/"),
            Change(field="payload size (bytes)", after=len(body.encode("utf-8"))),
            Change(field="Idempotency-Key header", after=context.idempotency_key),
        ),
    )


_ID = {"type": "integer", "minimum": 1, "description": "The note's id (from list_notes)."}
_TITLE = {"type": "string", "minLength": 1, "maxLength": 200}


@tool(
    name="list_notes",
    description=(
        f"List notes (id and title), oldest first, at most {LIST_LIMIT}. "
        "Use read_note to see a note's body."
    ),
    effect=Effect.READ,
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)
def list_notes(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Read-only. ``truncated`` says whether more notes exist than were listed."""
    notes = list(Note.objects.order_by("id").values("id", "title")[: LIST_LIMIT + 1])
    return {"notes": notes[:LIST_LIMIT], "truncated": len(notes) > LIST_LIMIT}


@tool(
    name="read_note",
    description="Read one note: its title, body and timestamps.",
    effect=Effect.READ,
    parameters={
        "type": "object",
        "properties": {"id": _ID},
        "required": ["id"],
        "additionalProperties": False,
    },
)
def read_note(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Read-only. A missing note raises ``NoteNotFound``."""
    return _note_as_dict(_get_note(arguments["id"]))


@tool(
    name="update_note",
    description=(
        "Set the title and/or body of an existing note (give at least one). Sets exactly the "
        "given fields, so repeating the same call changes nothing more."
    ),
    effect=Effect.IDEMPOTENT_WRITE,
    parameters={
        "type": "object",
        "properties": {
            "id": _ID,
            "title": {**_TITLE, "description": "The new title."},
            "body": {"type": "string", "description": "The new body (replaces it)."},
        },
        "required": ["id"],
        "additionalProperties": False,
    },
    preview=preview_update_note,
)
def update_note(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Idempotent write: one guarded ``UPDATE`` of the given fields; 0 rows → ``NoteNotFound``."""
    fields = {key: arguments[key] for key in ("title", "body") if key in arguments}
    if not fields:
        raise ValueError("give title, body or both")
    updated = Note.objects.filter(pk=arguments["id"]).update(**fields, updated_at=timezone.now())
    if updated == 0:
        raise NoteNotFound(f"note {arguments['id']} does not exist")
    return _note_as_dict(_get_note(arguments["id"]))


def check_create_note(context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
    """Landed when a note carries the call's idempotency key (that note is the result the model
    sees); not landed otherwise — the insert commits with its key or not at all."""
    note = Note.objects.filter(idempotency_key=context.idempotency_key).first()
    if note is None:
        return CheckAnswer.not_landed(f"no note carries the key {context.idempotency_key}")
    return CheckAnswer.landed(
        f"note {note.pk} carries the key {context.idempotency_key}", result=_note_as_dict(note)
    )


@tool(
    name="create_note",
    description="Create a new note. Each call creates another note, even with the same text.",
    effect=Effect.NON_IDEMPOTENT_WRITE,
    parameters={
        "type": "object",
        "properties": {
            "title": {**_TITLE, "description": "The note's title."},
            "body": {"type": "string", "description": "The note's text (may be empty)."},
        },
        "required": ["title", "body"],
        "additionalProperties": False,
    },
    preview=preview_create_note,
    check=check_create_note,
)
def create_note(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Non-idempotent write: inserts one note, stamped with the call's idempotency key (unique:
    one note per call at most), and returns it."""
    try:
        with transaction.atomic():
            note = Note.objects.create(
                title=arguments["title"],
                body=arguments["body"],
                idempotency_key=context.idempotency_key,
            )
    except IntegrityError:
        raise DuplicateCall(
            f"a note with the idempotency key {context.idempotency_key} exists: this call ran"
        ) from None
    return _note_as_dict(note)


def _connection(target: Target, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    return connection_for(target, timeout)


def _target(url: str) -> Target:
    """``url``'s checked target (``agentruns.outbound.resolve_target``: the allowlist, by name
    and by the addresses the name resolves to now). ``WebhookRefused`` as it is; a name that
    does not resolve is a ``ConnectionError``: nothing was sent."""
    try:
        return resolve_target(url, list(app_settings().webhook_allowlist))
    except WebhookRefused:
        raise
    except OSError as exc:
        raise ConnectionError(f"could not resolve the host, nothing was sent: {exc}") from exc


def check_call_webhook(context: CheckContext, arguments: dict[str, Any]) -> CheckAnswer:
    """The webhook status protocol (README): ``GET`` the same URL with the ``Idempotency-Key``
    header and ``?idempotency_key=<key>``; a 200 JSON ``{"landed": true|false}`` is the verdict.
    Anything else — another status, no JSON, no answer in time, a host no longer allowed — is
    unknown (a person decides)."""
    url = str(arguments.get("url"))
    try:
        target = _target(url)
    except (WebhookRefused, ConnectionError) as refused:
        return CheckAnswer.unknown(f"not asked: {refused}")
    connection, path = _connection(target, context.timeout_seconds)
    query = urlencode({"idempotency_key": context.idempotency_key})
    path += ("&" if "?" in path else "?") + query
    try:
        connection.request(
            "GET",
            path,
            headers={
                "Accept": "application/json",
                "Idempotency-Key": context.idempotency_key,
                "X-Fencing-Token": str(context.fencing_token),
            },
        )
        response = connection.getresponse()
        raw = response.read(WEBHOOK_BODY_CHARS * 4 + 1)
    except (OSError, http.client.HTTPException) as exc:
        return CheckAnswer.unknown(f"no answer to GET {path}: {type(exc).__name__}: {exc}")
    finally:
        connection.close()
    text = raw.decode("utf-8", errors="replace")[:200]
    if response.status != 200:
        return CheckAnswer.unknown(f"GET answered {response.status}: {text}")
    try:
        answer = json.loads(raw)
    except ValueError:
        return CheckAnswer.unknown(f"GET answered 200 without JSON: {text}")
    landed = answer.get("landed") if isinstance(answer, dict) else None
    if not isinstance(landed, bool):
        return CheckAnswer.unknown(f'GET answered 200 without {{"landed": true|false}}: {text}')
    evidence = f"GET answered {text}"
    if landed:
        return CheckAnswer.landed(evidence, result={"status": 200, "checked": answer})
    return CheckAnswer.not_landed(evidence)


@tool(
    name="call_webhook",
    description=(
        "POST a JSON payload to a webhook URL. Only hosts an operator allow-listed are reachable; "
        "any other URL is refused without sending. Redirects are not followed. Returns the HTTP "
        "status and the start of the response body. Each call sends another request."
    ),
    effect=Effect.NON_IDEMPOTENT_WRITE,
    # Approving a call (or saying whether one in doubt landed) needs this beside decide_agentrun.
    approve_permission="playground.approve_webhooks",
    parameters={
        "type": "object",
        "properties": {
            "url": {
                "type": "string",
                "minLength": 1,
                "maxLength": 2048,
                "description": "An http(s) URL on an allow-listed host.",
            },
            "payload": {"type": "object", "description": "The JSON object to send."},
        },
        "required": ["url", "payload"],
        "additionalProperties": False,
    },
    preview=preview_call_webhook,
    check=check_call_webhook,
)
def call_webhook(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Non-idempotent write. Checks the URL against ``WEBHOOK_ALLOWLIST`` (read now) by name and
    by the addresses the name resolves to, before any connection, and connects only to those
    addresses (``agentruns.outbound``); sends ``Idempotency-Key`` and ``X-Fencing-Token``; times
    out after ``context.timeout_seconds``. An HTTP status (errors included) is a result. A URL
    the allowlist refuses is ``ToolRefused`` (nothing was sent); a failure to resolve or connect
    is a failure (nothing was sent); a timeout or a lost
    connection once the request may have been sent raises ``OutcomeUnknown``: the run waits
    for reconciliation."""
    try:
        target = _target(arguments["url"])
    except WebhookRefused as refused:
        raise ToolRefused(str(refused)) from None
    connection, path = _connection(target, context.timeout_seconds)
    try:
        connection.connect()
    except OSError as exc:
        connection.close()
        raise ConnectionError(f"could not connect, nothing was sent: {exc}") from exc
    try:
        try:
            connection.request(
                "POST",
                path,
                body=json.dumps(arguments["payload"]).encode("utf-8"),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": context.idempotency_key,
                    "X-Fencing-Token": str(context.fencing_token),
                },
            )
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise OutcomeUnknown(
                f"the request may have been sent, but no answer came ({type(exc).__name__}: "
                f"{exc}); whether it took effect is unknown"
            ) from exc
        status = response.status
        try:
            raw = response.read(WEBHOOK_BODY_CHARS * 4 + 1)
        except (OSError, http.client.HTTPException):
            raw = b""  # the status is the answer; the body was cut short
    finally:
        connection.close()
    text = raw.decode("utf-8", errors="replace")
    truncated = len(raw) > WEBHOOK_BODY_CHARS * 4 or len(text) > WEBHOOK_BODY_CHARS
    return {"status": status, "body": text[:WEBHOOK_BODY_CHARS], "truncated": truncated}


@tool(
    name="wait",
    description=(
        "Pause for a number of seconds (capped by the tool timeout). Returns how long it waited."
    ),
    effect=Effect.READ,
    parameters={
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "maximum": WAIT_MAX_SECONDS},
        },
        "required": ["seconds"],
        "additionalProperties": False,
    },
)
def wait(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Sleeps ``min(seconds, context.timeout_seconds)`` and returns that duration."""
    requested = float(arguments["seconds"])
    seconds = max(0.0, min(requested, float(context.timeout_seconds)))
    time.sleep(seconds)
    return {"waited_seconds": seconds, "requested_seconds": requested}


@tool(
    name="ask_human",
    description=(
        "Ask a human operator a question and wait for the answer. Give only the question; "
        "the operator supplies the answer and a priority."
    ),
    effect=Effect.READ,
    parameters={
        "type": "object",
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": 2000},
            "answer": {"type": "string", "description": "Filled in by the human; leave it out."},
            "priority": {"type": "integer", "description": "Filled in by the human; leave out."},
        },
        "required": ["question"],
        "additionalProperties": False,
    },
    input_schema={
        "type": "object",
        "properties": {
            "answer": {
                "type": "string",
                "minLength": 1,
                "title": "Your answer",
                "description": "What the agent is told in reply to its question.",
            },
            "priority": {
                "type": "integer",
                "minimum": 0,
                "title": "Priority (0 or more)",
                "description": "0 is the least urgent; leave it empty if it does not matter.",
            },
        },
        "required": ["answer"],
        "additionalProperties": False,
    },
)
def ask_human(context: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Read. Runs after the human's values were overlaid; no answer → ``ValueError``."""
    if "answer" not in arguments:
        raise ValueError("no answer was supplied by a human")
    return {
        "question": arguments["question"],
        "answer": arguments["answer"],
        "priority": arguments.get("priority"),
    }


TOOLS: tuple[Tool, ...] = (
    list_notes,
    read_note,
    update_note,
    create_note,
    call_webhook,
    wait,
    ask_human,
)
