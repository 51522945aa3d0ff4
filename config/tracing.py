"""This project's OpenTelemetry set-up (README "Tracing with OpenTelemetry"): when the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and the
``otel`` extra is installed, every process (``manage.py`` — the worker cluster, the reaper's
schedule, commands — and the WSGI/ASGI application) exports its spans over OTLP/HTTP in
batches. The exporter reads the rest of the standard variables (headers, timeout, service name
through ``OTEL_SERVICE_NAME``).

Nothing happens when a provider is already set (``opentelemetry-instrument`` sets its own), when
no endpoint is set, or when the packages are missing: ``agentruns.tracing`` then records nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

logger = logging.getLogger(__name__)

ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def configure_from_env(environ: Mapping[str, str]) -> bool:
    """Set an SDK tracer provider exporting over OTLP/HTTP; whether one was set."""
    if not any(environ.get(name) for name in ENDPOINTS):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("an OTLP endpoint is set but leasehold[otel] is not installed: no spans")
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # configured already (opentelemetry-instrument, or the host project)
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or "leasehold"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
