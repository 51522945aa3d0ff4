"""Calls and digests: one proposed tool call as stored in the run's JSON, the digest that binds a
decision to the calls a human saw, and ``Unreadable``, the refusal every parser raises."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from agentruns.models import Effect

if TYPE_CHECKING:
    from agentruns.turns.origins import ToolOrigin
    from agentruns.turns.previews import Preview

APPROVAL: Final = "approval"
INPUT: Final = "input"
RECONCILIATION: Final = "reconciliation"
UNREADABLE: Final = "unreadable"
PendingKind: TypeAlias = Literal["approval", "input", "reconciliation", "unreadable"]


class Unreadable(ValueError):
    """Stored JSON that does not parse. The message is the reason, e.g. "it lists no calls"."""


def _object(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise Unreadable(f"{where} is not an object")
    return raw


def _int(raw: object, where: str, default: int = 0) -> int:
    if raw is None:
        return default
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise Unreadable(f"{where} is not an integer")
    return raw


def _strings(raw: object, where: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise Unreadable(f"{where} is not a list of strings")
    return list(raw)


# --- Digests ----------------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_digest(
    calls: Iterable[Call | Mapping[str, Any]], *, input_schema: Mapping[str, Any] | None = None
) -> str:
    """SHA-256 of the canonical JSON of the calls (``Call.digested``: id, name, arguments,
    preview and, for a call as a card shows it, its tool as shown) — what binds a human decision
    to the turn the human saw (docs/design.md §5.3).

    The call id is included beside the name and arguments so that a model proposing the very
    same call in a later turn gets a new digest: a decision for the old turn is then "already
    decided", never silently valid for the new one. An input digest also covers the schema.
    """
    digested = [
        call.digested() if isinstance(call, Call) else _digested_mapping(call) for call in calls
    ]
    body: dict[str, Any] = {"calls": digested}
    if input_schema is not None:
        body["input_schema"] = input_schema
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def _digested_mapping(call: Mapping[str, Any]) -> dict[str, Any]:
    """A stored call's JSON digested exactly as the ``Call`` it parses into (``Unreadable`` when
    it does not parse)."""
    return Call.parse(dict(call), where="the call", effect_required=False).digested()


# --- Calls ------------------------------------------------------------------------------------


def argument_order(arguments: Any) -> list[str] | None:
    """The keys of ``arguments`` in the order the model sent them, when there is an order to
    keep (an object of two or more keys): PostgreSQL's jsonb does not keep it."""
    if isinstance(arguments, dict) and len(arguments) > 1:
        return [str(key) for key in arguments]
    return None


def ordered_arguments(arguments: Any, order: object) -> Any:
    """``arguments`` with its keys in ``order`` (the stored ``argument_order``); keys the order
    does not name follow in their stored order; anything not an object is returned as it is."""
    if not isinstance(arguments, dict) or not isinstance(order, list):
        return arguments
    ordered = {key: arguments[key] for key in order if isinstance(key, str) and key in arguments}
    ordered.update((key, value) for key, value in arguments.items() if key not in ordered)
    return ordered


@dataclass(frozen=True)
class CallEdit:
    """A person changed a call's arguments before anything ran (an ``edit`` verdict): the
    arguments the model proposed (``original_arguments``, kept however often it is edited) and
    who edited last (``editor``, their username; ``editor_id``). The editor is the author of
    the arguments: under four-eyes someone else must approve them."""

    original_arguments: Any
    editor: str = ""
    editor_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "original_arguments": self.original_arguments,
            "editor": self.editor,
            "editor_id": self.editor_id,
        }

    @classmethod
    def parse(cls, raw: object, *, where: str) -> CallEdit:
        data = _object(raw, where)
        editor = data.get("editor", "")
        editor_id = data.get("editor_id")
        if not isinstance(editor, str):
            raise Unreadable(f"{where} names no editor")
        if editor_id is not None and (
            not isinstance(editor_id, int) or isinstance(editor_id, bool)
        ):
            raise Unreadable(f"{where} has a malformed editor id")
        return cls(
            original_arguments=data.get("original_arguments"), editor=editor, editor_id=editor_id
        )


@dataclass(frozen=True)
class Call:
    """One tool call the model proposed: its id (unique within the run), tool name, arguments
    and the tool's effect as known when it was proposed.

    An approval turn's calls also carry what the approver is shown (``detailed``): whether the
    call needs a decision, whether its tool is known, where it comes from and its hints.
    """

    id: str
    name: str
    arguments: Any = None
    effect: str = ""  # "" when not recorded (an older stored turn)
    needs_approval: bool = True
    known: bool = True
    source: str = "local"
    hints: dict[str, Any] = field(default_factory=dict)
    detailed: bool = False
    # What the write will change, made when the turn suspended for approval; digested.
    preview: Preview | None = None
    # Where its tool comes from, as the card shows it (``agentruns.tools.gate.ToolGate.shown``
    # reads it now); ``None`` for a call as the model proposed it. Digested with the effect.
    origin: ToolOrigin | None = None
    # A person's edit of the arguments (``arguments`` are then the edited ones); digested.
    edit: CallEdit | None = None

    @property
    def effect_label(self) -> str:
        return str(Effect(self.effect).label) if self.effect in Effect.values else self.effect

    @property
    def is_write(self) -> bool:
        return self.effect != Effect.READ

    def digested(self) -> dict[str, Any]:
        """What a digest covers: id, name and arguments, and the preview when there is one; for
        a call as a card shows it (``origin`` set), everything else the card shows of it too:
        its effect, whether its tool is known and needs a decision, its source and hints, and
        where its tool comes from (description, MCP server). Display-only keys (the order of the
        arguments' keys) are not digested."""
        digested: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.preview is not None:
            digested["preview"] = self.preview.to_json()
        if self.edit is not None:
            digested["edit"] = self.edit.to_json()
        if self.origin is not None:
            digested.update(
                effect=self.effect,
                needs_approval=self.needs_approval,
                known=self.known,
                source=self.source,
                hints=dict(self.hints),
                origin=self.origin.to_json(),
            )
        return digested

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "effect": self.effect,
        }
        if (order := argument_order(self.arguments)) is not None:
            data["argument_order"] = order  # not digested: only how the keys are shown
        if self.detailed:
            data.update(
                needs_approval=self.needs_approval,
                known=self.known,
                source=self.source,
                hints=dict(self.hints),
            )
        if self.preview is not None:
            data["preview"] = self.preview.to_json()
        if self.origin is not None:
            data["origin"] = self.origin.to_json()
        if self.edit is not None:
            data["edit"] = self.edit.to_json()
        return data

    @classmethod
    def parse(cls, raw: object, *, where: str, effect_required: bool = True) -> Call:
        """A stored call. Refuses a call without a string id or a tool name, and (unless
        ``effect_required`` is false) one whose effect is not a known effect."""
        from agentruns.turns.origins import ToolOrigin  # origins builds on this module
        from agentruns.turns.previews import Preview  # previews builds on this module

        data = _object(raw, where)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise Unreadable(f"{where} has no tool name")
        call_id = data.get("id")
        if not isinstance(call_id, str):
            raise Unreadable(f"{where} has no call id")
        effect = data.get("effect")
        if effect is None and not effect_required:
            effect = ""
        elif effect not in Effect.values:
            raise Unreadable(f"{where} has an unknown effect")
        hints = data.get("hints")
        return cls(
            id=call_id,
            name=name,
            arguments=ordered_arguments(data.get("arguments", {}), data.get("argument_order")),
            effect=str(effect),
            needs_approval=data.get("needs_approval", True) is not False,
            known=data.get("known", True) is not False,
            source=str(data.get("source") or "local"),
            hints=dict(hints) if isinstance(hints, dict) else {},
            detailed="needs_approval" in data or "known" in data or "hints" in data,
            preview=(
                Preview.parse(data["preview"], where=f"{where}'s preview")
                if data.get("preview") is not None
                else None
            ),
            origin=(
                ToolOrigin.parse(data["origin"], where=f"{where}'s origin")
                if data.get("origin") is not None
                else None
            ),
            edit=(
                CallEdit.parse(data["edit"], where=f"{where}'s edit")
                if data.get("edit") is not None
                else None
            ),
        )
