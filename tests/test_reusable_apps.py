"""``agentruns`` and ``approvals`` work in someone else's project (``tests/minimal_project``):
the contrib apps, django-q2 and the two apps, no ``AGENTRUNS`` setting, no DRF, no playground,
no project templates. The scenario runs in a fresh process so nothing of this project's
settings or imports leaks into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)


@pytest.mark.slow
def test_a_minimal_project_checks_migrates_runs_an_agent_and_renders_the_inbox(
    tmp_path: Path,
) -> None:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AGENTRUNS_", "DATABASE_URL", "DJANGO_"))
    }
    env["DJANGO_SETTINGS_MODULE"] = "tests.minimal_project.settings"
    env["MINIMAL_PROJECT_DB"] = str(tmp_path / "minimal.sqlite3")
    finished = subprocess.run(
        [sys.executable, "-m", "tests.minimal_project.scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = f"stdout:\n{finished.stdout}\nstderr:\n{finished.stderr}"
    assert finished.returncode == 0, report
    assert "scenario passed" in finished.stdout, report
    assert "System check identified no issues" in finished.stdout, report
