"""Shared fixtures: the repository's paths and the built book."""

import json
import subprocess
import sys
import time
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


# The suite's own time, as a figure (make bench reports it beside the build's): each
# item's setup, call and teardown, summed, and the whole run's wall time; written by a
# run of the whole suite (make test) only.
TEST_TIMES = ROOT / "_build" / "test-times.json"
_started = time.monotonic()
_item_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _item_seconds[report.nodeid] = _item_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    # A skipped check is not a passed check: a run that skipped anything fails.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.stats.get("skipped") and exitstatus == 0:
        reporter.write_line("FAILED: tests were skipped; every check must run.", red=True)
        session.exitstatus = 1
    if session.config.invocation_params.args:
        return  # a part of the suite: the figure is the whole suite's
    slowest = sorted(_item_seconds.items(), key=lambda item: -item[1])[:10]
    record = {
        "wall_seconds": round(time.monotonic() - _started, 1),
        "items": len(_item_seconds),
        "exit_status": int(session.exitstatus),
        "arguments": list(session.config.invocation_params.args),
        "slowest": [{"test": name, "seconds": round(sec, 1)} for name, sec in slowest],
    }
    TEST_TIMES.parent.mkdir(exist_ok=True)
    TEST_TIMES.write_text(json.dumps(record, indent=2) + "\n")
