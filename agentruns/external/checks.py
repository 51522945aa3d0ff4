"""System checks of the external surface (``agentruns.E070``–``E074``): reads settings and the
installed packages, never the database.

* ``E070``: ``EXTERNAL_STATE_MAX_BYTES`` above 16 MiB — every claim reads the state with the
  row, and a state that large is a framework's transcript kept in the wrong place.
* ``E071``: ``langgraph`` is installed in a version the LangGraph adapter was not built for
  (``leasehold[langgraph]`` pins 1.2.x).
* ``E072``: ``langchain-core`` is installed without ``langgraph``, or the reverse, while the
  adapter's extra expects both.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured

from agentruns.conf import app_settings

STATE_CEILING = 16 * 1024 * 1024
LANGGRAPH_SERIES = "1.2."


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@register()
def check_external(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    found: list[CheckMessage] = []
    try:
        limit = app_settings().external_state_max_bytes
    except ImproperlyConfigured:
        limit = 0  # the settings check reports it
    if limit > STATE_CEILING:
        found.append(
            Error(
                f"AGENTRUNS['EXTERNAL_STATE_MAX_BYTES'] is {limit}; at most {STATE_CEILING} "
                "(16 MiB) are accepted",
                hint="store a reference to the framework's state (a thread id, a checkpoint "
                "key) rather than the state itself",
                obj="settings.AGENTRUNS",
                id="agentruns.E070",
            )
        )
    langgraph, core = _version("langgraph"), _version("langchain-core")
    if langgraph is not None and not langgraph.startswith(LANGGRAPH_SERIES):
        found.append(
            Error(
                f"langgraph {langgraph} is installed; agentruns.external.langgraph supports "
                f"{LANGGRAPH_SERIES}x",
                hint='install the extra: pip install "leasehold[langgraph]"',
                id="agentruns.E071",
            )
        )
    if (langgraph is None) != (core is None):
        missing = "langgraph" if langgraph is None else "langchain-core"
        found.append(
            Error(
                f"{missing} is not installed beside the other: the LangGraph adapter needs both",
                hint='install the extra: pip install "leasehold[langgraph]"',
                id="agentruns.E072",
            )
        )
    return found
