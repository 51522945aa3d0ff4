"""Test support: real servers and helpers shared by the test suites."""
