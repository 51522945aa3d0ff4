"""Fixtures for the agentruns tests."""

from tests.agentruns.runtime_support import probes  # noqa: F401  (fixture)
