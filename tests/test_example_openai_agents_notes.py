"""``examples/openai_agents_notes.py`` runs as the README says, on its own SQLite database: the
write waits for the inbox, the worker killed mid-write leaves it in doubt, the reconciled write
is never run again, and the ledger verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow]


def test_the_openai_agents_notes_example_runs_to_the_end():
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_agents_notes.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "waiting in the inbox: save_note" in out
    assert "worker exit code -9; notes in the table: 1" in out
    assert "reaper: in_doubt (fence)" in out
    assert "the run is waiting_for_reconciliation" in out
    assert "notes with the key: 1" in out
    assert "the run is completed" in out and "took effect" in out
    assert "events intact" in out
