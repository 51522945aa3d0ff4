"""Real threads released at once against the database (``race``), for the race tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None


def race(calls: list[Callable[[], Any]], *, timeout: float = 60) -> list[Outcome]:
    """Run every call in its own thread, all released at once; return their outcomes in order."""
    barrier = threading.Barrier(len(calls))
    outcomes = [Outcome() for _ in calls]

    def runner(index: int, call: Callable[[], Any]) -> None:
        try:
            connection.ensure_connection()
            barrier.wait(timeout=timeout)
            outcomes[index].value = call()
        except BaseException as exc:  # reported to the test thread
            outcomes[index].error = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=item) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a racer hung"
    return outcomes
