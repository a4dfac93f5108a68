"""The one line that installs the package beside a reader's own code names a fixed version.

That line (on the tool's page) and every chapter's setup cell install the tag
``gradstop-v<version>`` of ``pyproject.toml``'s version; scripts/setup_cell.py makes both,
and ``make lint`` fails while a chapter's cell names another. The line itself is run in
an empty virtual environment by ``make install-check`` (tests/check_install.py): it
takes minutes (torch is installed), so it is not part of ``make test``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import nbformat

import nbcheck
import setup_cell

ROOT = nbcheck.ROOT
PAGE = ROOT / "book" / "why-no-grad-tool.ipynb"
LINE = re.compile(r'^pip install "gradstop @ git\+(?P<url>\S+)@(?P<tag>[\w.-]+)"$', re.M)
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]


def page_line() -> str:
    nb = nbformat.read(PAGE, as_version=4)
    found = [m for c in nb.cells if c.cell_type == "markdown" for m in LINE.finditer(c.source)]
    assert len(found) == 1, "the tool's page must give exactly one install line"
    return found[0][0]


def test_the_page_gives_the_line_the_setup_cells_install_from():
    assert page_line() == setup_cell.install_line()
    assert f"@{setup_cell.tag()}" in setup_cell.source()


def test_the_named_version_is_the_packages_own():
    assert setup_cell.tag() == f"gradstop-v{VERSION}"
    assert LINE.search(page_line())["tag"] == f"gradstop-v{VERSION}"


def test_the_check_catches_a_version_bumped_without_rewriting_the_cells(tmp_path):
    nbcheck.repo_copy(tmp_path, ["_config.yml", "notebooks", "scripts"])
    (tmp_path / "pyproject.toml").write_text(
        (ROOT / "pyproject.toml").read_text("utf-8").replace(VERSION, "99.0.0", 1)
    )
    check = subprocess.run(
        [sys.executable, "scripts/check-notebooks"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode != 0 and "setup_cell.py" in check.stderr


def git(*args, cwd=ROOT, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def test_a_tag_of_that_name_holds_this_package():
    tag = setup_cell.tag()
    if git("rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).returncode != 0:
        # Not tagged yet (the publisher tags on release): the README must say how.
        assert "git tag gradstop-v" in (ROOT / "README.md").read_text("utf-8")
        return
    changed = git("diff", "--stat", tag, "--", "src/gradstop", "pyproject.toml").stdout
    assert changed == "", (
        f"the package changed since {tag}: bump the version in pyproject.toml and run "
        f"scripts/setup_cell.py\n{changed}"
    )
