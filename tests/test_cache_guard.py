"""scripts/invalidate-stale-cache drops the execution cache when anything a page depends on changes.

Jupyter Book re-runs a chapter only when the chapter's own code changes. The pages
also depend on the helper code the chapters import, on the book's Sphinx extensions
and on the pins; a change to any one of them must make every chapter run again.
"""

import shutil
import subprocess

import pytest

import nbcheck

ROOT = nbcheck.ROOT
# What the built pages depend on besides the chapters' own code, one file of each kind.
HELPERS = sorted(
    p.relative_to(ROOT)
    for folder in ("notebooks", "src")
    if (ROOT / folder).is_dir()
    for p in (ROOT / folder).rglob("*.py")
)
DEPENDENCIES = [
    pytest.param(HELPERS[0], id="the chapters' helper code"),
    pytest.param(
        sorted((ROOT / "book" / "_ext").glob("*.py"))[0].relative_to(ROOT),
        id="the Sphinx extensions",
    ),
    pytest.param("requirements.txt", id="the pins"),
]


@pytest.mark.parametrize("changed", DEPENDENCIES)
def test_a_change_drops_the_execution_cache(tmp_path, changed):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", repo / "scripts")
    for name in [*HELPERS, *(p.relative_to(ROOT) for p in (ROOT / "book/_ext").glob("*.py"))]:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    shutil.copy(ROOT / "requirements.txt", repo / "requirements.txt")
    script = [str(repo / "scripts" / "invalidate-stale-cache")]
    subprocess.run(script, check=True, capture_output=True)
    (repo / "_build" / ".jupyter_cache").mkdir(parents=True)
    subprocess.run(script, check=True, capture_output=True)
    assert (repo / "_build" / ".jupyter_cache").exists(), "dropped with nothing changed"
    with open(repo / changed, "a", encoding="utf-8") as file:
        file.write("\n# changed\n")
    subprocess.run(script, check=True, capture_output=True)
    assert not (repo / "_build" / ".jupyter_cache").exists(), f"{changed} changed, cache kept"
