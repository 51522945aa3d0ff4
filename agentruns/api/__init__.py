"""The HTTP API (docs/design.md §11.2): DRF serializers, views and routes under ``/api/``.

Owns request parsing and response shapes only. Every view parses, calls one service or selector
from ``agentruns`` and renders; refusals are the typed ``agentruns.exceptions``, mapped to HTTP
once in ``config.api.exception_handler``. Never writes run state itself.
"""
