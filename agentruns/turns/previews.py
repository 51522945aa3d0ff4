"""A preview of a write: what an approver is shown will change, stored with the call it previews
and covered by the turn's digest (docs/design.md §5.10).

A tool's ``preview(context, arguments)`` returns a ``Preview`` (or a mapping of the same shape);
``Preview.bounded`` keeps what is stored small and safe to show: at most ``MAX_CHANGES`` changes,
each value cut at ``MAX_VALUE_CHARS`` with a mark, and everything storable (``storable``: NUL and
lone surrogates → U+FFFD, NaN / Infinity → strings, nesting past ``MAX_VALUE_DEPTH`` cut; named in
``normalised``). A preview that failed is stored as such, with the exception's class only (its
text can carry credentials).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agentruns.storable import KINDS, TEXT, NotJson, mend_json, storable_text
from agentruns.turns.calls import Unreadable, _object, canonical_json

MAX_CHANGES = 20
MAX_VALUE_CHARS = 2000
MAX_SUMMARY_CHARS = 500
MAX_TARGET_CHARS = 300
MAX_VALUE_DEPTH = 32
CUT_MARK = "… [cut]"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT_MARK)] + CUT_MARK


def _bounded_value(value: Any, marks: set[str]) -> Any:
    """A JSON value as stored: short scalars as they are; a long string, or a structure whose
    JSON is long, becomes a cut string. Mended first (``marks`` gets what was changed);
    ``ValueError`` for a value JSON cannot hold."""
    try:
        mended = mend_json(value, max_chars=100 * MAX_VALUE_CHARS, max_depth=MAX_VALUE_DEPTH)
    except NotJson as exc:
        raise ValueError(f"a change's value is not JSON: {exc}") from None
    marks.update(mended.normalised)
    value = mended.value
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _cut(value, MAX_VALUE_CHARS)
    text = canonical_json(value)
    return value if len(text) <= MAX_VALUE_CHARS else _cut(text, MAX_VALUE_CHARS)


def _text(value: str, marks: set[str]) -> str:
    cleaned = storable_text(value)
    if cleaned is not value:
        marks.add(TEXT)
    return cleaned


@dataclass(frozen=True)
class Change:
    """One field the write changes: its value before (``None``: it does not exist yet) and
    after."""

    field: str
    before: Any = None
    after: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class Preview:
    """What a write will change: a ``summary``, an optional ``target`` (what it acts on) and its
    ``changes``; or, when the preview could not be made, ``failed`` (an exception class name).
    ``normalised``: what was changed so that it could be stored (``storable.mend_json``'s
    kinds), stored with it."""

    summary: str = ""
    target: str | None = None
    changes: tuple[Change, ...] = ()
    failed: str = ""
    normalised: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    @classmethod
    def failure(cls, reason: str) -> Preview:
        return cls(failed=_cut(storable_text(reason or "Error"), 100))

    @classmethod
    def bounded(cls, value: Preview | Mapping[str, Any]) -> Preview:
        """``value`` (what a tool's preview returned) as stored: summary, target and values cut,
        at most ``MAX_CHANGES`` changes (the summary says how many more there were).
        ``ValueError`` when it is not a preview's shape."""
        summary: object
        target: object
        if isinstance(value, Preview):
            summary, target = value.summary, value.target
            raw_changes: list[Any] = [c.to_json() for c in value.changes]
        elif isinstance(value, Mapping):
            summary, target = value.get("summary"), value.get("target")
            raw_changes = list(value.get("changes") or [])
        else:
            raise ValueError(f"a preview is a Preview or a mapping, not {type(value).__name__}")
        if not isinstance(summary, str) or not summary.strip():
            raise ValueError("a preview needs a summary")
        if target is not None and not isinstance(target, str):
            raise ValueError("a preview's target is a string or None")
        marks: set[str] = set()
        changes = []
        for raw in raw_changes[:MAX_CHANGES]:
            if not isinstance(raw, Mapping) or not isinstance(raw.get("field"), str):
                raise ValueError("each change is {field, before, after}")
            changes.append(
                Change(
                    field=_cut(_text(raw["field"], marks), 200),
                    before=_bounded_value(raw.get("before"), marks),
                    after=_bounded_value(raw.get("after"), marks),
                )
            )
        more = len(raw_changes) - len(changes)
        if more > 0:
            summary = f"{summary} (and {more} more change{'s' if more > 1 else ''} not shown)"
        return cls(
            summary=_cut(_text(summary, marks).strip(), MAX_SUMMARY_CHARS),
            target=_cut(_text(target, marks), MAX_TARGET_CHARS) if target is not None else None,
            changes=tuple(changes),
            normalised=tuple(kind for kind in KINDS if kind in marks),
        )

    def to_json(self) -> dict[str, Any]:
        if self.failed:
            return {"failed": self.failed}
        data: dict[str, Any] = {
            "summary": self.summary,
            "target": self.target,
            "changes": [change.to_json() for change in self.changes],
        }
        if self.normalised:
            data["normalised"] = list(self.normalised)
        return data

    def same_as(self, other: Preview | None) -> bool:
        """Whether ``other`` shows exactly this (compared as stored JSON)."""
        return other is not None and canonical_json(self.to_json()) == canonical_json(
            other.to_json()
        )

    def still_holds(self, fresh: Preview | None) -> bool:
        """Whether ``fresh`` — this preview made again just before the approved call runs — still
        shows what was approved (compare-and-swap, docs/design.md §5.10): exactly the same; or
        the same target and the same changes to the same values, where a field may already hold
        its approved value (this very write landed before, e.g. by a segment that died after
        it; an idempotent write then converges). Anything else did change."""
        if fresh is None or not fresh.ok:
            return False
        if self.same_as(fresh):
            return True
        if not self.changes or fresh.target != self.target:
            return False
        if len(fresh.changes) != len(self.changes):
            return False
        for approved, now in zip(self.changes, fresh.changes, strict=True):
            after = canonical_json(approved.after)
            if now.field != approved.field or canonical_json(now.after) != after:
                return False
            if canonical_json(now.before) not in (canonical_json(approved.before), after):
                return False
        return True

    @classmethod
    def parse(cls, raw: object, *, where: str) -> Preview:
        data = _object(raw, where)
        if "failed" in data:
            failed = data["failed"]
            if not isinstance(failed, str) or not failed:
                raise Unreadable(f"{where} is a failed preview without a reason")
            return cls(failed=failed)
        marks = data.get("normalised") or []
        if not isinstance(marks, list) or any(mark not in KINDS for mark in marks):
            raise Unreadable(f"{where} names an unknown change made for storage")
        try:
            parsed = replace(cls.bounded(data), normalised=tuple(marks))
        except ValueError as exc:
            raise Unreadable(f"{where} is malformed: {exc}") from exc
        if not parsed.same_as(cls._exact(data)):
            raise Unreadable(f"{where} is not bounded as stored previews are")
        return parsed

    @classmethod
    def _exact(cls, data: Mapping[str, Any]) -> Preview:
        changes = tuple(
            Change(field=c["field"], before=c.get("before"), after=c.get("after"))
            for c in data.get("changes") or []
        )
        return cls(
            summary=data["summary"],
            target=data.get("target"),
            changes=changes,
            normalised=tuple(data.get("normalised") or ()),
        )
