"""Fixtures for the agentruns tests."""

from collections.abc import Iterator

import pytest

from agentruns.providers.scripted import ScriptedProvider
from tests.agentruns.support.runtime import probes  # noqa: F401  (fixture)
from tests.agentruns.support.tracing import spans  # noqa: F401  (fixture)


@pytest.fixture
def scripted_recordings() -> Iterator[type[ScriptedProvider]]:
    """Record what the scripted provider is sent during the test (it keeps nothing otherwise);
    ``ScriptedProvider.recorded(run_uuid)`` reads it."""
    with ScriptedProvider.recording():
        yield ScriptedProvider
