"""The examples run: each as a script in its own process, against a SQLite file of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_langgraph_notes_example_saves_once_through_a_kill_and_a_reconciliation(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'example.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings.local",
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "langgraph_notes.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exit -9" in done.stdout
    assert "waiting_for_reconciliation" in done.stdout
    assert "notes titled 'dentist': 1 (exactly once)" in done.stdout
    assert done.stdout.count("ledger: ") == 2 and "BROKEN" not in done.stdout
    assert "claimed by its agent loop (langgraph)" in done.stdout
