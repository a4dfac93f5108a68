#!/usr/bin/env python3
"""The first code cell of every chapter: it makes a copy of the chapter run anywhere.

    python scripts/setup_cell.py     rewrite that cell in every chapter from _config.yml

A chapter opened outside the book's repository (its page's download button,
Colab) has no ``gradstop``, the book's helper package. The cell installs it
with pip from the repository named in ``_config.yml`` (``repository.url``, the
same place the Binder and Colab buttons are made from), at the tag of the
package's own version (``gradstop-v`` and ``pyproject.toml``'s version: a fixed
version, so a chapter downloaded today installs the package it was written for
after the package changes), or from the folder or URL in the environment
variable ``GRADSTOP_SOURCE``. It installs
Graphviz's ``dot`` with apt-get when it is missing and the notebook runs as root
(as on Colab), and otherwise says in one line what to install. Where both are
already there (the repository, Binder, the build) it prints nothing; the book's
pages leave it out (``remove-cell``).

Change the repository in ``_config.yml`` or the version in ``pyproject.toml``, run
this script, commit the chapters: ``make lint`` fails while a chapter's cell
disagrees with either. The publisher tags that version (README, "Publishing").
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
TAGS = ["remove-cell"]

TEMPLATE = """\
# Setup for a copy of this chapter opened outside the book's repository (a
# download, Colab): installs the book's helper package, gradstop, and Graphviz
# where it can. In the book's own environment it does nothing.
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from IPython import get_ipython

if get_ipython() is not None:  # a failing cell shows its error, not every frame
    get_ipython().InteractiveTB.set_mode("Minimal")
BOOK = "git+{url}@{tag}"
source = os.environ.get("GRADSTOP_SOURCE", BOOK)  # or a local clone's folder
if importlib.util.find_spec("gradstop") is None:
    url = source if "://" in source else Path(source).resolve().as_uri()
    package = f"gradstop[chapters] @ {{url}}"
    pip = [sys.executable, "-m", "pip", "install", "-q", package]
    if subprocess.run(pip, capture_output=True).returncode != 0:
        class SetupError(Exception):
            def _render_traceback_(self):  # one sentence, not pip's traceback
                return [f"SetupError: {{self}}"]
        raise SetupError(
            f"pip could not install gradstop from {{url}}: check the network, "
            "or clone the book and set GRADSTOP_SOURCE to the clone's folder, "
            "then run this cell again.")
    importlib.invalidate_caches()
root = shutil.which("apt-get") and os.getuid() == 0  # as on Colab
if shutil.which("dot") is None and root:
    subprocess.run("apt-get -qq update && apt-get -qq install -y graphviz",
                   shell=True, capture_output=True)
if shutil.which("dot") is None:
    print("Graphviz's dot program is missing; the graph pictures need it: "
          "install it ('sudo apt-get install graphviz', 'brew install "
          "graphviz' or 'conda install graphviz'), then restart the kernel.")"""


def repository(root: Path = ROOT) -> str:
    """The repository named in ``root``'s _config.yml."""
    config = yaml.safe_load((root / "_config.yml").read_text("utf-8"))
    return config["repository"]["url"].rstrip("/")


def tag(root: Path = ROOT) -> str:
    """The tag of the package's version, ``gradstop-v0.2.0``: what every cell installs."""
    project = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["project"]
    return f"gradstop-v{project['version']}"


def install_line(root: Path = ROOT) -> str:
    """The one line a reader runs to install the package beside their own code."""
    return f'pip install "gradstop @ git+{repository(root)}@{tag(root)}"'


def source(root: Path = ROOT) -> str:
    """The setup cell's code, for the repository and the package version of ``root``."""
    return TEMPLATE.format(url=repository(root), tag=tag(root))


def chapters(root: Path = ROOT) -> list[Path]:
    """The notebooks that start with the setup cell: every chapter, and the template."""
    return sorted((root / "notebooks").glob("*.ipynb"))


def problems(nb, path: Path | str, root: Path = ROOT) -> list[str]:
    """What is wrong with a chapter's setup cell (nothing, when it is the current one)."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    name = Path(path).name
    if not code or code[0].source != source(root):
        return [
            f"{name}: the first code cell is not the setup cell that _config.yml gives; "
            "run 'python scripts/setup_cell.py' to write it"
        ]
    if code[0].metadata.get("tags") != TAGS:
        return [f"{name}: the setup cell must carry exactly the tags {TAGS}"]
    return []


def write(path: Path, root: Path = ROOT) -> bool:
    """Put the current setup cell first in ``path``; True if the file changed."""
    nb = nbformat.read(path, as_version=4)
    if not problems(nb, path, root):
        return False
    code = [c for c in nb.cells if c.cell_type == "code"]
    if code and code[0].metadata.get("tags") == TAGS:
        nb.cells.remove(code[0])  # an older setup cell
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    cell = nbformat.v4.new_code_cell(source(root), metadata={"tags": list(TAGS)})
    cell.id = "gradstop-setup"  # the same id on every rewrite: no churn in the diff
    nb.cells.insert(first, cell)
    nbformat.write(nb, path)
    return True


def main() -> int:
    changed = [p for p in chapters() if write(p)]
    for path in changed:
        print(f"setup_cell: wrote the setup cell of {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
