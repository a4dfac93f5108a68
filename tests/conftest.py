"""Shared fixtures: the repository's paths and the built book."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The notebook checks live in scripts/ (make lint and make bench use them too); the
# chapters' helper package, gradstop, is installed in .venv by scripts/setup-env.
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

HTML = ROOT / "_build" / "html"


@pytest.fixture(scope="session")
def built_book():
    """Build the book exactly as the README's `make book` does; fail with its log if it fails."""
    result = subprocess.run(
        ["make", "--no-print-directory", "book"], cwd=ROOT, capture_output=True, text=True
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"make book failed:\n{log[-8000:]}"
    return HTML


def pytest_sessionfinish(session, exitstatus):
    # A skipped check is not a passed check: a run that skipped anything fails.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.stats.get("skipped") and exitstatus == 0:
        reporter.write_line("FAILED: tests were skipped; every check must run.", red=True)
        session.exitstatus = 1
