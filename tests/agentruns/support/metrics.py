"""Reading ``/metrics`` back as samples."""

from __future__ import annotations

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families


def samples(client: Client, **headers: str) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")  # the exposition format
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
