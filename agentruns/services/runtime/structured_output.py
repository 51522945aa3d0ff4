"""Structured output (docs/design.md §6.3): a configuration's ``output_schema`` and the final
answer that must match it.

When a configuration sets ``output_schema`` (an object schema, checked by ``check_schema`` like a
tool's parameters), the system prompt ends with ``schema_instruction`` and the final answer must
be one JSON value — the whole answer, or one fenced block that is the whole answer — that
``tools.schemas.schema_errors`` accepts: the bounded validator tool arguments go through (RE2
patterns, the size and depth bounds of ``AGENTRUNS_MAX_ARGUMENT_CHARS``, no fetched reference).
``judge`` says what a final answer leads to:

* accepted: the run completes with the answer as its ``output`` and the parsed value as its
  ``output_object``;
* the first answer that fails is sent back once (``MAX_REPAIRS``): an ``output_check`` event,
  recorded with the answer, whose ``message`` — what failed, path by path — the model reads as
  a user message, and the loop asks again (offering tools as before, none after the round cap);
  ``LoopState.output_repairs`` counts it, saved by the same boundary;
* the next answer that fails ends the run ``failed`` / ``bad_output``, the answer recorded and
  an ``error`` event saying what failed. So does a schema the validator cannot use (a row
  written around ``clean``): no answer could match it.

Free of the segment: ``judge`` reads the schema, the answer and the loop state, and returns the
events to write; the segment's one hook (``segment._settle_answer``) writes them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentruns.leases import EventSpec
from agentruns.models import EventKind
from agentruns.storable import json_problem
from agentruns.tools.schemas import InvalidSchema, SchemaError, schema_errors
from agentruns.turns import LoopState

#: How many times a final answer that does not match is sent back before the run fails.
MAX_REPAIRS = 1
_FENCED = re.compile(r"\A```[A-Za-z]*[ \t]*\n(.*)\n[ \t]*```\Z", re.DOTALL)


@dataclass(frozen=True)
class Judgement:
    """What a final answer leads to: ``repair`` (an ``output_check`` event: send it back),
    ``failure`` (the run's error: end ``bad_output``), or neither: accepted, with ``value`` the
    parsed answer when a schema applied (``structured``)."""

    structured: bool = False
    value: Any = None
    repair: EventSpec | None = None
    failure: dict[str, Any] | None = None


def schema_instruction(schema: Any) -> str:
    """What the system prompt adds for ``schema``: the answer's form, and the schema itself."""
    text = json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return (
        "Your final answer (the one without tool calls) must be a single JSON value, and "
        f"nothing else, matching this JSON schema: {text}"
    )


def parse_answer(content: str) -> tuple[Any, list[SchemaError]]:
    """The answer as a JSON value, or the problems that stop it being one (at the root): not
    JSON, ``NaN`` or ``Infinity``, nesting past the parser, or what no column stores (NUL, a
    lone surrogate, ``1e999``). Surrounding whitespace and one fence around the whole answer
    are not part of it."""
    text = content.strip()
    fenced = _FENCED.match(text)
    if fenced is not None:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        return None, [SchemaError((), "the answer is nested too deeply to parse")]
    except ValueError as exc:
        return None, [SchemaError((), f"the answer is not JSON ({exc})")]
    problem = json_problem(value)
    if problem is not None:
        return None, [SchemaError((), f"the answer cannot be stored: {problem}")]
    return value, []


def judge(schema: Any, content: str, state: LoopState) -> Judgement:
    """What the final answer ``content`` leads to under ``schema`` (``None``: no schema,
    accepted as text). A repair is counted in ``state.output_repairs`` (the boundary that
    writes its event saves it)."""
    if schema is None:
        return Judgement()
    value, problems = parse_answer(content)
    if not problems:
        try:
            problems = schema_errors(schema, value)
        except InvalidSchema as exc:
            return Judgement(
                failure=_failure(f"the configuration's output_schema is unusable: {exc}")
            )
    if not problems:
        return Judgement(structured=True, value=value)
    said = "; ".join(str(problem) for problem in problems)
    if state.output_repairs >= MAX_REPAIRS:
        return Judgement(
            failure=_failure(f"the final answer did not match the output schema: {said}")
        )
    state.output_repairs += 1
    message = (
        f"Your final answer did not match the required JSON schema: {said}. Answer again with "
        "only a JSON value that matches it."
    )
    payload = {"ok": False, "errors": [p.as_dict() for p in problems], "message": message}
    return Judgement(repair=EventSpec(EventKind.OUTPUT_CHECK, payload))


def _failure(message: str) -> dict[str, Any]:
    return {"type": "BadOutput", "message": message[:500]}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
