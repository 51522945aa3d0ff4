"""An OpenTelemetry SDK tracer provider for one test (``spans`` fixture): every span the test
makes is kept by the SDK's in-memory exporter; before and after it, the process has no provider
(the API's proxy: ``agentruns.tracing`` records nothing), as in a deployment without one.

The API sets its global provider once per process; the fixture resets that guard as the
OpenTelemetry project's own test utilities do (``opentelemetry.test.globals_test``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.util._once import Once


def _reset_globals() -> None:
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace_api._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace_api._PROXY_TRACER_PROVIDER = trace_api.ProxyTracerProvider()  # type: ignore[attr-defined]


@dataclass
class Spans:
    """The spans finished so far, read by name, id and parent."""

    exporter: InMemorySpanExporter

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, [span.name for span in self.all()]
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        span_id = parent.context.span_id
        return [s for s in self.all() if s.parent is not None and s.parent.span_id == span_id]

    def attribute_values(self) -> list[Any]:
        """Every attribute value of every span, its events' included."""
        values: list[Any] = []
        for span in self.all():
            values.extend((span.attributes or {}).values())
            for event in span.events:
                values.extend((event.attributes or {}).values())
        return values


def install(sampler: Sampler | None = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    """Set an SDK provider exporting to memory as the process's provider."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace_api.set_tracer_provider(provider)
    return provider, exporter


def uninstall(provider: TracerProvider) -> None:
    provider.shutdown()
    _reset_globals()


@pytest.fixture
def spans() -> Iterator[Spans]:
    """An SDK tracer provider for this test; yields what it exported."""
    provider, exporter = install()
    try:
        yield Spans(exporter)
    finally:
        uninstall(provider)


def hex_trace(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def hex_span(span: ReadableSpan) -> str:
    return format(span.context.span_id, "016x")
