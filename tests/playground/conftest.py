"""Fixtures for the playground: developers (staff with ``playground.use_playground``)."""

from __future__ import annotations

import threading

import pytest

from playground.stream import THREAD_PREFIX
from tests.agentruns.factories import UserFactory

USE = "playground.use_playground"
DECIDE = "agentruns.decide_agentrun"
START = "agentruns.start_agentrun"


@pytest.fixture
def developer(db):
    return UserFactory(username="dev", permissions=[USE, START, DECIDE])


@pytest.fixture
def dev_client(client, developer):
    client.force_login(developer)
    return client


def join_streams(timeout: float = 30) -> None:
    """Wait for every background segment a stream started (they close their connections)."""
    for thread in threading.enumerate():
        if thread.name == THREAD_PREFIX:
            thread.join(timeout)
            assert not thread.is_alive(), "a streamed segment did not stop"
