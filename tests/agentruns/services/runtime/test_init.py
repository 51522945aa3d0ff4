"""The runtime package's edges: an interface imports what a segment tells it without importing
the loop, and the tool step answers with plain values."""

from __future__ import annotations

import os
import subprocess
import sys


def test_results_and_turns_import_without_the_loop_or_the_writer():
    code = (
        "import django, sys; django.setup();"
        "import agentruns.services.runtime.results, agentruns.turns, agentruns.leases;"
        "loaded = [m for m in ('agentruns.services.runtime.segment', 'agentruns.transitions',"
        " 'agentruns.transitions._writer', 'agentruns.transitions._statements')"
        " if m in sys.modules];"
        "print(','.join(loaded))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"},
    )
    assert done.stdout.strip() == ""
