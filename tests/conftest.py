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
# The package from this checkout, even where .venv's editable install points at
# another one (test_breaks runs the suite on a copy that shares the .venv).
sys.path.insert(0, str(ROOT / "src"))

HTML = ROOT / "_build" / "html"

import nbcheck  # noqa: E402


@pytest.fixture(scope="session")
def built_book():
    """Build the book exactly as the README's `make book` does; fail with its log if it fails."""
    result = subprocess.run(
        ["make", "--no-print-directory", "book"], cwd=ROOT, capture_output=True, text=True
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"make book failed:\n{log[-8000:]}"
    return HTML


@pytest.fixture(scope="session")
def clone_build(tmp_path_factory):
    """A second clean build of the same files, in another folder (another clone).

    `make book` there from nothing: every chapter executed afresh, into its own
    cache. tests/test_reproducible.py compares its pages with the main build's;
    tests/test_notebooks.py checks its executed chapters.
    """
    clone = tmp_path_factory.mktemp("clone")
    nbcheck.clone_copy(clone)
    result = subprocess.run(
        ["make", "--no-print-directory", "book"], cwd=clone, capture_output=True, text=True
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"make book failed in {clone}:\n{log[-6000:]}"
    return clone


def pytest_sessionfinish(session, exitstatus):
    # A skipped check is not a passed check: a run that skipped anything fails.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.stats.get("skipped") and exitstatus == 0:
        reporter.write_line("FAILED: tests were skipped; every check must run.", red=True)
        session.exitstatus = 1
