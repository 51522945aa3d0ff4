"""This project's OpenTelemetry set-up (``config/tracing.py``; README "Tracing with
OpenTelemetry"): with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, a run's spans reach an OTLP/HTTP
receiver (a real local server) as protobuf; without it nothing is set up."""

from __future__ import annotations

import os

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentruns import tracing
from agentruns.services.runs import run_start_sync
from config.tracing import configure_from_env
from tests.agentruns.factories import AgentConfigurationFactory
from tests.agentruns.support.tracing import uninstall

pytestmark = pytest.mark.django_db


def test_without_an_endpoint_nothing_is_set_up(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert configure_from_env(os.environ) is False
    assert not tracing.enabled()


def test_with_an_endpoint_a_runs_spans_reach_the_otlp_receiver(monkeypatch, http_recorder):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", http_recorder.url("").rstrip("/"))
    monkeypatch.setenv("OTEL_SERVICE_NAME", "leasehold-test")
    assert configure_from_env(os.environ) is True
    provider = trace.get_tracer_provider()
    try:
        assert configure_from_env(os.environ) is False  # set once: a second call keeps it
        run = run_start_sync(
            configuration=AgentConfigurationFactory(tools=[]),
            prompt="go",
            options={"script": [{"content": "ok"}]},
        ).run
        assert provider.force_flush()  # type: ignore[attr-defined]
    finally:
        uninstall(provider)  # type: ignore[arg-type]
    posts = [r for r in http_recorder.requests if r.path == "/v1/traces"]
    assert posts
    for post in posts:
        headers = {name.lower(): value for name, value in post.headers.items()}
        assert headers["content-type"] == "application/x-protobuf"
    names, trace_ids, services = set(), set(), set()
    for post in posts:
        request = ExportTraceServiceRequest.FromString(post.body)
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    names.add(span.name)
                    trace_ids.add(span.trace_id.hex())
    assert {"leasehold.run", "leasehold.segment", "chat"} <= names
    assert trace_ids == {run.trace_id}
    assert services == {"leasehold-test"}
