"""OpenTelemetry spans of runs (docs/design.md §6.9; README "Tracing with OpenTelemetry").

The one module that imports ``opentelemetry``, guarded: without the optional ``otel`` extra, or
with no tracer provider configured (the API's proxy), every function here returns at once and
nothing is recorded, read or stored. With an SDK provider a run is one trace:

- the **run span** (``leasehold.run``) is started and ended when the run is inserted; its trace
  id and span id are stored on the row (``trace_id``, ``trace_span_id``: ``run_born``). A run
  lives across processes, so no span stays open for it;
- each **segment** (``leasehold.segment``: lease owner, epoch, outcome), **decision**,
  **reaper verdict** and **in-doubt** span is a child of that stored span, rebuilt as a remote
  ``SpanContext`` in whatever process handles the run;
- a segment's **model calls** (``chat <model>``: the GenAI semantic conventions' ``gen_ai.*``)
  and **tool calls** (``execute_tool <name>``: effect, fenced, idempotency key, outcome) are
  children of the segment span.

A run span the sampler dropped stores its trace id without a span id: the run's later spans are
started under an unsampled parent, so a parent-based sampler drops them too. A run inserted with
tracing off has no trace id; each of its segments then starts a trace of its own.

Content — prompts, messages, tool arguments and results, error texts — is never put on a span
unless ``AGENTRUNS["OTEL_CAPTURE_CONTENT"]`` is on (``content``). An exception ending a span
records its class name only.

Must not import Django models or the runtime: every caller passes plain values or the run row.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:  # the optional extra ``leasehold[otel]``
    from opentelemetry import trace as _otel
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
    )
    from opentelemetry.trace import (
        ProxyTracerProvider as _Proxy,
    )
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _otel = None  # type: ignore[assignment]

TRACER_NAME = "leasehold"
#: The run's columns a span of it reads (a query that loads runs to trace them selects these).
RUN_FIELDS = ("trace_id", "trace_span_id")
#: Longest text a content attribute carries (characters); longer is cut and marked.
CONTENT_LIMIT = 4096

# The tracer of the provider it came from: read again when the global provider changes.
_tracer_cache: tuple[object, Any] | None = None


def _tracer() -> Any | None:
    """The tracer, or ``None`` when nothing would record: the extra is not installed, or no
    provider was set (the API's proxy provider, whose tracers record nothing)."""
    global _tracer_cache
    if _otel is None:
        return None
    provider = _otel.get_tracer_provider()
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = None if isinstance(provider, _Proxy) else provider.get_tracer(TRACER_NAME)
    _tracer_cache = (provider, tracer)
    return tracer


def enabled() -> bool:
    """Whether spans are recorded in this process (an SDK tracer provider is set)."""
    return _tracer() is not None


def capture_content() -> bool:
    """``AGENTRUNS["OTEL_CAPTURE_CONTENT"]``: prompts, arguments and results go on spans."""
    from agentruns.conf import app_settings

    return app_settings().otel_capture_content


class Traced:
    """One open span, or none (tracing off): what a caller records on it. Attributes are set
    only while it records; content only when ``capture_content()``."""

    __slots__ = ("span",)

    def __init__(self, span: Any = None) -> None:
        self.span = span

    @property
    def recording(self) -> bool:
        return self.span is not None and self.span.is_recording()

    def set(self, **attributes: Any) -> None:
        """Set attributes, named with ``__`` for ``.`` (``gen_ai__usage__input_tokens``); a
        ``None`` value is left out."""
        if self.recording:
            for name, value in attributes.items():
                if value is not None:
                    self.span.set_attribute(name.replace("__", "."), value)

    def content(self, name: str, value: Any) -> None:
        """Set ``name`` to ``value`` as text (JSON for anything else), cut to ``CONTENT_LIMIT``
        — only when content capture is on."""
        if self.recording and capture_content():
            self.span.set_attribute(name, _text(value))

    def failed(self, error_type: str) -> None:
        """Mark the span as ended in error (``error.type``: a class name or a stable kind,
        never a message)."""
        if self.recording:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, error_type))


OFF = Traced()


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…[cut]"


# --- The run's trace ---------------------------------------------------------------------------


def run_born(
    *, run_uuid: Any, configuration: str, initiator_id: int | None, mode: str, prompt: str
) -> dict[str, str]:
    """Start and end the run span of a run about to be inserted; the fields the row stores
    (``{}`` when tracing is off). Its own trace, linked to the span current here (the request
    that started it, when the host traces requests)."""
    tracer = _tracer()
    if tracer is None:
        return {}
    current = _otel.get_current_span().get_span_context()
    span = tracer.start_span(
        "leasehold.run",
        context=Context(),
        kind=SpanKind.INTERNAL,
        links=[Link(current)] if current.is_valid else None,
        attributes={
            "leasehold.run.uuid": str(run_uuid),
            "leasehold.configuration": configuration,
            "leasehold.run.mode": mode,
            **({"leasehold.initiator.id": initiator_id} if initiator_id is not None else {}),
        },
    )
    Traced(span).content("leasehold.run.prompt", prompt)
    span.end()
    made = span.get_span_context()
    if not made.is_valid:
        return {}
    sampled = made.trace_flags.sampled
    return {
        "trace_id": format(made.trace_id, "032x"),
        "trace_span_id": format(made.span_id, "016x") if sampled else "",
    }


def _run_context(run: Any) -> Any:
    """The context a span of ``run`` starts in: under its stored run span (remote), unsampled
    when the run span was dropped; an empty one (a new trace) when the run has no trace id."""
    trace_id = getattr(run, "trace_id", "") or ""
    if not trace_id:
        return Context()
    span_id = getattr(run, "trace_span_id", "") or ""
    parent = SpanContext(
        trace_id=int(trace_id, 16),
        # An unsampled run stored no span id: any valid one will do, nothing records it.
        span_id=int(span_id, 16) if span_id else secrets.randbits(63) + 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if span_id else TraceFlags.DEFAULT),
    )
    return _otel.set_span_in_context(NonRecordingSpan(parent), Context())


def _in_run(run: Any) -> Any:
    """The current span's context when it belongs to ``run``'s trace (a step inside a segment),
    else the run's (``_run_context``)."""
    current = _otel.get_current_span().get_span_context()
    trace_id = getattr(run, "trace_id", "") or ""
    if current.is_valid and trace_id and format(current.trace_id, "032x") == trace_id:
        return None  # the current context
    return _run_context(run)


@contextmanager
def _span(
    name: str, *, context: Any, kind: Any = None, attributes: Mapping[str, Any] | None = None
) -> Iterator[Traced]:
    """A span made current for the block; an exception ends it in error by its class name
    only (``BaseException`` too: a test's crash point), and is raised on."""
    tracer = _tracer()
    if tracer is None:
        yield OFF
        return
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=kind if kind is not None else SpanKind.INTERNAL,
        attributes=dict(attributes or {}),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        traced = Traced(span)
        try:
            yield traced
        except BaseException as exc:
            traced.failed(type(exc).__name__)
            raise


def _point(run: Any, name: str, attributes: Mapping[str, Any]) -> None:
    """A span that marks a moment of ``run`` (a decision, a verdict): started and ended."""
    if _tracer() is None:
        return
    with _span(name, context=_in_run(run), attributes=_present(attributes)):
        pass


def _present(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in attributes.items() if value is not None}


# --- A segment and its calls -------------------------------------------------------------------


@contextmanager
def segment(run: Any, *, owner: str, epoch: int) -> Iterator[Traced]:
    """The span of one segment of ``run`` under its lease, a child of the run span."""
    if _tracer() is None:
        yield OFF
        return
    attributes = {
        "leasehold.run.uuid": str(run.uuid),
        "leasehold.segment.kind": owner.split(":", 1)[0],
        "leasehold.lease.owner": owner,
        "leasehold.lease.epoch": epoch,
    }
    with _span("leasehold.segment", context=_run_context(run), attributes=attributes) as traced:
        yield traced


#: ``gen_ai.provider.name`` (and the older ``gen_ai.system``) of each provider kind.
GEN_AI_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "scripted": "leasehold.scripted"}


@contextmanager
def model_call(
    *, provider: str, model: str, max_tokens: int | None, messages: Any, final: bool
) -> Iterator[Traced]:
    """The span of one provider call (``chat <model>``, kind ``CLIENT``), a child of the
    current segment span; the caller records the reply with ``model_reply``."""
    if _tracer() is None:
        yield OFF
        return
    system = GEN_AI_PROVIDERS.get(provider, provider)
    attributes = _present(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": system,
            "gen_ai.system": system,
            "gen_ai.request.model": model or None,
            "gen_ai.request.max_tokens": max_tokens or None,
            "leasehold.model.final": final,
        }
    )
    name = f"chat {model}" if model else "chat"
    with _span(name, context=None, kind=SpanKind.CLIENT, attributes=attributes) as traced:
        traced.content("gen_ai.input.messages", messages)
        yield traced


def model_reply(traced: Traced, reply: Any) -> None:
    """Record a provider's reply (or its ``ProviderError``) on a ``model_call`` span. The
    finish reason is read from the reply's shape: ``tool_calls`` when it proposes calls, else
    ``stop``."""
    if not traced.recording:
        return
    if isinstance(reply, BaseException):
        traced.failed(str(getattr(reply, "kind", "") or type(reply).__name__))
        return
    usage = reply.usage if isinstance(reply.usage, Mapping) else {}
    traced.set(
        gen_ai__response__model=reply.model or None,
        gen_ai__usage__input_tokens=_count(usage.get("prompt_tokens")),
        gen_ai__usage__output_tokens=_count(usage.get("completion_tokens")),
        gen_ai__response__finish_reasons=["tool_calls" if reply.tool_calls else "stop"],
    )
    traced.content("gen_ai.output.messages", reply.as_message())


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@contextmanager
def tool_call(
    *, name: str, call_id: str, effect: str, idempotency_key: str, arguments: Any
) -> Iterator[Traced]:
    """The span of one tool call (``execute_tool <name>``), a child of the current segment
    span; the caller records how it ended with ``tool_outcome``."""
    if _tracer() is None:
        yield OFF
        return
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "leasehold.tool.effect": effect,
        "leasehold.tool.idempotency_key": idempotency_key,
    }
    with _span(f"execute_tool {name}", context=None, attributes=attributes) as traced:
        traced.content("gen_ai.tool.call.arguments", arguments)
        yield traced


def tool_outcome(
    traced: Traced, *, outcome: str, fenced: bool, ok: bool | None = None, result: Any = None
) -> None:
    """How a ``tool_call`` ended: ``executed`` or ``refused`` (as its ``tool`` event says, with
    ``ok``), ``in_doubt``, ``not_started`` (the fence stamp matched no row: the lease is lost)
    or ``interrupted`` (a read cut off by a stopping worker); whether its effect was stamped on
    the row first (the fence). An error result (``ok`` false) ends the span in error
    (``error.type`` ``tool_error``), as do ``in_doubt`` and ``not_started``."""
    traced.set(
        leasehold__tool__outcome=outcome, leasehold__tool__fenced=fenced, leasehold__tool__ok=ok
    )
    if outcome in ("in_doubt", "not_started"):
        traced.failed(outcome)
    elif ok is False:
        traced.failed("tool_error")
    if result is not None:
        traced.content("gen_ai.tool.call.result", result)


# --- Moments of a run outside its segments -----------------------------------------------------


def decision(run: Any, *, kind: str, payload: Mapping[str, Any], actor_id: int | None) -> None:
    """A decision that took effect on ``run`` (approval, input, reconciliation; ``deadline``:
    the approval deadline's action), from its event's ``kind`` and ``payload``: who decided (by
    id), the mode and the verdict."""
    if _tracer() is None:
        return
    approved = payload.get("approved")
    calls = payload.get("calls")
    _point(
        run,
        "leasehold.decision",
        {
            "leasehold.run.uuid": str(run.uuid),
            "leasehold.decision.kind": kind,
            "leasehold.decision.mode": _plain(payload.get("mode")),
            "leasehold.decision.by": _plain(payload.get("by")) or "person",
            "leasehold.decision.approved": approved if isinstance(approved, bool) else None,
            "leasehold.decision.verdict": _plain(payload.get("verdict")),
            "leasehold.decision.per_call": payload.get("per_call") is True,
            "leasehold.decision.calls": len(calls) if isinstance(calls, list) else None,
            "leasehold.decider.id": actor_id,
        },
    )


def reaper_verdict(run: Any, *, rule: str, verdict: str, result: str) -> None:
    """The reaper's verdict on a stale run: the rule, the verdict, what it left the run in, and
    the lease it found (owner, epoch)."""
    if _tracer() is None:
        return
    _point(
        run,
        "leasehold.reaper.verdict",
        {
            "leasehold.run.uuid": str(run.uuid),
            "leasehold.reaper.rule": rule,
            "leasehold.reaper.verdict": verdict,
            "leasehold.reaper.result": result or None,
            "leasehold.lease.owner": run.claimed_by or None,
            "leasehold.lease.epoch": run.lease_epoch,
            "leasehold.fence.effect": run.pending_effect or None,
        },
    )


def in_doubt(run: Any, *, by: str, call_name: str, check: str = "", answer: str = "") -> None:
    """``run``'s write is in doubt (``by``: ``segment``, the tool said so; ``reaper``, its
    segment died mid-write), or a check recorded where it stands (``by="check"``, its status
    and answer)."""
    if _tracer() is None:
        return
    _point(
        run,
        "leasehold.in_doubt",
        {
            "leasehold.run.uuid": str(run.uuid),
            "leasehold.in_doubt.by": by,
            "gen_ai.tool.name": call_name or None,
            "leasehold.check.status": check or None,
            "leasehold.check.answer": answer or None,
        },
    )


def _plain(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
