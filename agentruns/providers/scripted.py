"""The ``scripted`` provider: plays a fixed list of turns (docs/design.md §6.7), for tests and
demos.

A script is a list of turns, each a dict with at least one of

- ``"content": str`` — the assistant's text;
- ``"tool_calls": [{"name": str, "arguments": {...}}, ...]`` — calls (``arguments`` optional);
- ``"error": "retryable" | "fatal"`` — raise a ``ProviderError`` of that class instead of
  answering; with ``"times": N`` only the first N attempts at this turn for a run fail (counted
  in this process, for the last ``MAX_COUNTED_TURNS`` run turns that failed), after which the
  turn's content/tool calls are played;

and optionally ``"delay": seconds`` (sleep before answering or failing) and
``"usage": {"prompt_tokens": int, "completion_tokens": int}`` (``null``: report no usage at all,
as an endpoint that sends none; counts not given are estimated).

A turn may instead answer what happened to the previous turn's calls: ``{"branches": [turn,
...]}``, each branch a turn as above with ``"when"``: a result kind or a list of them
(``agentruns.tools.result_kinds``: ``ok``, ``error``, ``refused``, ``denied``, ``expired``,
``answered``).
The first branch whose ``when`` holds the previous result is played; a branch without ``when``
holds any. The previous result is read from the tool messages after the last assistant message,
as a model reads them: ``denied`` if any call was denied, else ``expired``, ``answered`` (a
person gave its result in place of running it), ``refused``, ``error``, else ``ok`` (also when
there is none). No branch holding it is ``script_invalid``.

Stateless across processes: the turn played is the number of ``assistant`` messages already in
``messages``, so a run continued elsewhere plays the right turn. Tool call ids are
``call_<turn index>_<call index>``.

Recording what was sent is for tests only: off unless ``ScriptedProvider.recording()`` is on
(the ``scripted_recordings`` test fixture), and bounded even then — deep-copied messages in
``ScriptedProvider.recordings[run_uuid]`` for the last ``MAX_RECORDED_RUNS`` runs, the last
``MAX_RECORDED_CALLS`` calls each. A server that plays scripts keeps nothing of a run's dialogue.
"""

from __future__ import annotations

import copy
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from agentruns.conf import app_settings
from agentruns.providers.base import ErrorKind, ProviderError, ProviderReply, ToolCall
from agentruns.tools.result_kinds import (
    ANSWERED,
    DENIED,
    ERROR,
    EXPIRED,
    OK,
    REFUSED,
    RESULT_KINDS,
    result_kind,
)

_TURN_KEYS = frozenset({"content", "tool_calls", "error", "times", "delay", "usage"})
_BRANCH_KEYS = _TURN_KEYS | {"when"}
# Which kind a turn of several calls came to: the first of these any of its calls has.
_KIND_ORDER = (DENIED, EXPIRED, ANSWERED, REFUSED, ERROR)
_CALL_KEYS = frozenset({"name", "arguments"})
_ERROR_CLASSES = {"retryable": True, "fatal": False}


def _invalid(message: str) -> ProviderError:
    return ProviderError(
        f"Malformed script: {message}", kind=ErrorKind.SCRIPT_INVALID, retryable=False
    )


def _is_number(value: Any) -> bool:
    """A finite JSON number (``1e999`` parses as infinity: not one)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _validate_turn(index: int, turn: Any) -> None:
    """Raise ``script_invalid`` naming the first problem of ``turn`` (or of one of its
    branches), checked in this order."""
    where = f"turn {index}"
    if isinstance(turn, dict) and "branches" in turn:
        _check_branches(where, turn)
        return
    _check_answer(where, turn, _TURN_KEYS)


def _check_branches(where: str, turn: dict[str, Any]) -> None:
    if set(turn) != {"branches"}:
        raise _invalid(
            f"{where}: 'branches' cannot be mixed with {sorted(set(turn) - {'branches'})}."
        )
    branches = turn["branches"]
    if not isinstance(branches, list) or not branches:
        raise _invalid(f"{where}: 'branches' must be a non-empty list of turns.")
    for position, branch in enumerate(branches):
        branch_where = f"{where}, branch {position}"
        _check_answer(branch_where, branch, _BRANCH_KEYS)
        kinds = branch.get("when", list(RESULT_KINDS))
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list) or not kinds or not set(kinds) <= set(RESULT_KINDS):
            raise _invalid(
                f"{branch_where}: 'when' must be one of {list(RESULT_KINDS)} or a list of them."
            )


def _check_answer(where: str, turn: Any, allowed: frozenset[str]) -> None:
    if not isinstance(turn, dict):
        raise _invalid(f"{where} must be an object, got {type(turn).__name__}.")
    unknown = set(turn) - allowed
    if unknown:
        raise _invalid(f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}.")
    _check_error(where, turn)
    if "content" in turn and not isinstance(turn["content"], str):
        raise _invalid(f"{where}: 'content' must be a string.")
    if "tool_calls" in turn:
        _check_tool_calls(where, turn["tool_calls"])
    if "delay" in turn:
        _check_delay(where, turn["delay"])
    if "usage" in turn and turn["usage"] is not None:
        _check_usage(where, turn["usage"])


def _check_error(where: str, turn: dict[str, Any]) -> None:
    """``error`` (with ``times``, which needs an answer to give after) or an answer."""
    answers = "content" in turn or "tool_calls" in turn
    if "error" not in turn:
        if "times" in turn:
            raise _invalid(f"{where}: 'times' is only meaningful with 'error'.")
        if not answers:
            raise _invalid(f"{where} needs 'content', 'tool_calls' or 'error'.")
        return
    if not isinstance(turn["error"], str) or turn["error"] not in _ERROR_CLASSES:
        raise _invalid(f"{where}: 'error' must be 'retryable' or 'fatal'.")
    if "times" in turn:
        times = turn["times"]
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise _invalid(f"{where}: 'times' must be a positive integer.")
        if not answers:
            raise _invalid(f"{where}: an error with 'times' needs 'content' or 'tool_calls'.")


def _check_tool_calls(where: str, calls: Any) -> None:
    if not isinstance(calls, list) or not calls:
        raise _invalid(f"{where}: 'tool_calls' must be a non-empty list.")
    for position, call in enumerate(calls):
        _check_call(f"{where}, call {position}", call)


def _check_call(call_where: str, call: Any) -> None:
    if not isinstance(call, dict):
        raise _invalid(f"{call_where} must be an object.")
    if set(call) - _CALL_KEYS:
        raise _invalid(f"{call_where} has unknown keys {sorted(set(call) - _CALL_KEYS)}.")
    if not isinstance(call.get("name"), str) or not call["name"]:
        raise _invalid(f"{call_where} needs a non-empty string 'name'.")
    if not isinstance(call.get("arguments", {}), dict):
        raise _invalid(f"{call_where}: 'arguments' must be an object.")


def _check_delay(where: str, delay: Any) -> None:
    if not _is_number(delay) or delay < 0:
        raise _invalid(f"{where}: 'delay' must be a finite, non-negative number of seconds.")
    if delay > app_settings().tool_timeout_seconds:
        raise _invalid(
            f"{where}: 'delay' may not exceed the tool timeout "
            f"({app_settings().tool_timeout_seconds:g} s, AGENTRUNS_TOOL_TIMEOUT_SECONDS)."
        )


def _check_usage(where: str, usage: Any) -> None:
    if not isinstance(usage, dict) or not all(
        isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
        for key, value in usage.items()
    ):
        raise _invalid(f"{where}: 'usage' must map token counter names to integers.")


def validate_script(script: Any) -> list[dict[str, Any]]:
    """Return ``script`` if it is a well-formed list of turns; else raise ``ProviderError``
    (``script_invalid``, not retryable) naming the first problem."""
    if not isinstance(script, list):
        raise _invalid(f"the script must be a list of turns, got {type(script).__name__}.")
    for index, turn in enumerate(script):
        _validate_turn(index, turn)
    return script


def _assistant_count(messages: list[dict[str, Any]]) -> int:
    return sum(1 for message in messages if message.get("role") == "assistant")


def previous_result(messages: list[dict[str, Any]]) -> str:
    """The kind the previous turn's calls came to (see the module docstring)."""
    kinds = set()
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        kinds.add(result_kind(message.get("content")))
    return next((kind for kind in _KIND_ORDER if kind in kinds), OK)


def _branch(index: int, turn: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``turn`` itself, or the branch of it that answers the previous result."""
    if "branches" not in turn:
        return turn
    kind = previous_result(messages)
    for branch in turn["branches"]:
        when = branch.get("when", list(RESULT_KINDS))
        if kind == when or (isinstance(when, list) and kind in when):
            return {key: value for key, value in branch.items() if key != "when"}
    raise _invalid(f"turn {index} has no branch for a previous result that is {kind!r}.")


# ``json.dumps(value, sort_keys=True, default=str)``, the encoder built once, not per call.
_estimate_text = json.JSONEncoder(sort_keys=True, default=str).encode


def _estimate_tokens(value: Any) -> int:
    return max(1, len(_estimate_text(value)) // 4)


class ScriptedProvider:
    """Plays a script; see the module docstring for the turn format and the recording."""

    MAX_RECORDED_RUNS: ClassVar[int] = 64
    MAX_RECORDED_CALLS: ClassVar[int] = 500
    MAX_COUNTED_TURNS: ClassVar[int] = 1024

    # run uuid -> the messages of each call, oldest run first; filled only while recording.
    recordings: ClassVar[OrderedDict[str, list[list[dict[str, Any]]]]] = OrderedDict()
    _recording: ClassVar[bool] = False
    # (run uuid, turn index) -> failed attempts so far, for error turns only ("times").
    _attempts: ClassVar[OrderedDict[tuple[str, int], int]] = OrderedDict()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *, script: Any, model: str = "") -> None:
        self.script = script
        self.model = model or "scripted"
        # The script is checked on the first call (a provider lives for one segment). Nothing
        # of a dialogue is kept.
        self._checked: list[dict[str, Any]] | None = None

    @classmethod
    @contextmanager
    def recording(cls) -> Iterator[None]:
        """Record what every call is sent while the block runs (tests). Recordings and attempt
        counts are cleared when it starts and when it ends; blocks do not nest."""
        cls.clear_recordings()
        with cls._lock:
            cls._recording = True
        try:
            yield
        finally:
            with cls._lock:
                cls._recording = False
            cls.clear_recordings()

    @classmethod
    def is_recording(cls) -> bool:
        """Whether a ``recording()`` block is on."""
        return cls._recording

    @classmethod
    def clear_recordings(cls, run_uuid: str | None = None) -> None:
        """Forget what was sent and the attempts counted: for one run, or for every run when
        ``run_uuid`` is None."""
        with cls._lock:
            if run_uuid is None:
                cls.recordings.clear()
                cls._attempts.clear()
                return
            cls.recordings.pop(str(run_uuid), None)
            for key in [key for key in cls._attempts if key[0] == str(run_uuid)]:
                del cls._attempts[key]

    @classmethod
    def recorded(cls, run_uuid: str) -> list[list[dict[str, Any]]]:
        """A deep copy of the message lists sent for ``run_uuid``, one per call, in order (empty
        unless recording was on)."""
        with cls._lock:
            return copy.deepcopy(cls.recordings.get(str(run_uuid), []))

    @classmethod
    def _record(cls, run_uuid: str, messages: list[dict[str, Any]]) -> None:
        """Keep a deep copy of ``messages`` when recording is on; within the bounds."""
        if not cls._recording:  # read without the lock: a call racing the switch may go either way
            return
        snapshot = copy.deepcopy(messages)
        with cls._lock:
            if not cls._recording:
                return
            calls = cls.recordings.setdefault(str(run_uuid), [])
            cls.recordings.move_to_end(str(run_uuid))
            calls.append(snapshot)
            del calls[: -cls.MAX_RECORDED_CALLS]
            while len(cls.recordings) > cls.MAX_RECORDED_RUNS:
                cls.recordings.popitem(last=False)

    @classmethod
    def _attempt(cls, run_uuid: str, index: int) -> int:
        """Count one more attempt at error turn ``index`` of ``run_uuid``; the count so far."""
        key = (str(run_uuid), index)
        with cls._lock:
            attempt = cls._attempts.pop(key, 0) + 1
            cls._attempts[key] = attempt
            while len(cls._attempts) > cls.MAX_COUNTED_TURNS:
                cls._attempts.popitem(last=False)
        return attempt

    def complete(
        self, *, messages: list[dict[str, Any]], tools: list[dict[str, Any]], run_uuid: str
    ) -> ProviderReply:
        """Play turn ``len(assistant messages)``; raise ``ProviderError`` for a malformed script
        (``script_invalid``), no turn left (``script_exhausted``) or a scripted ``error`` turn
        (``scripted``, retryable as scripted). While recording is on, each call is recorded
        before anything else."""
        index = _assistant_count(messages)
        self._record(run_uuid, messages)
        if self._checked is None:
            self._checked = validate_script(self.script)
        script = self._checked
        if index >= len(script):
            raise ProviderError(
                f"The script has {len(script)} turn(s) and turn {index} was requested.",
                kind=ErrorKind.SCRIPT_EXHAUSTED,
                retryable=False,
            )
        turn = _branch(index, script[index], messages)
        attempt = self._attempt(run_uuid, index) if "error" in turn else 0
        if turn.get("delay"):
            time.sleep(float(turn["delay"]))
        if "error" in turn and ("times" not in turn or attempt <= turn["times"]):
            raise ProviderError(
                f"Scripted {turn['error']} failure at turn {index} (attempt {attempt}).",
                kind=ErrorKind.SCRIPTED,
                retryable=_ERROR_CLASSES[turn["error"]],
            )
        calls = [
            ToolCall(
                id=f"call_{index}_{position}",
                name=call["name"],
                arguments=copy.deepcopy(call.get("arguments", {})),
            )
            for position, call in enumerate(turn.get("tool_calls", []))
        ]
        content = turn.get("content", "")
        if "usage" in turn and turn["usage"] is None:
            return ProviderReply(content=content, tool_calls=calls, usage={}, model=self.model)
        usage = dict(turn.get("usage", {}))
        usage.setdefault("prompt_tokens", _estimate_tokens(messages))
        usage.setdefault(
            "completion_tokens",
            _estimate_tokens({"content": content, "tool_calls": turn.get("tool_calls", [])}),
        )
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        return ProviderReply(content=content, tool_calls=calls, usage=usage, model=self.model)
