"""Root test configuration: shared fixtures only (keep it small)."""

from collections.abc import Iterator

import pytest

from tests.support.browser import browser  # noqa: F401  (fixture)
from tests.support.chat_server import chat_server  # noqa: F401  (fixture)
from tests.support.http_recorder import http_recorder  # noqa: F401  (fixture)
from tests.support.mcp_server import hostile_mcp_server, mcp_server  # noqa: F401  (fixtures)
from tests.support.messages_server import messages_server  # noqa: F401  (fixture)
from tests.support.processes import holding_server, processes  # noqa: F401  (fixtures)
from tests.support.resolver import scripted_dns  # noqa: F401  (fixture)
from tests.support.smtp_server import smtp_server  # noqa: F401  (fixture)
from tests.support.webhook_receiver import webhook_receiver  # noqa: F401  (fixture)


@pytest.fixture(autouse=True)
def _fresh_version_cache() -> Iterator[None]:
    """Configuration versions are cached in-process by id (``agentruns.versions``); a test's
    rolled-back database may reuse an id, so every test starts with an empty cache."""
    from agentruns import versions

    versions.forget_all()
    yield
