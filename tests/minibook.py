"""A small book with this repository's configuration, build machinery and chosen notebooks.

For tests of the build itself: what the executor and the extensions do with a
notebook written for the purpose, in seconds rather than the whole book's minutes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import nbcheck

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
MACHINERY = [
    "_config.yml",
    "Makefile",
    "requirements.txt",
    "requirements-dev.txt",
    "requirements-lab.txt",
    "scripts",
]


def cell(source: str, raises: str | None = None):
    """A code cell; with raises=(type, message) it is declared to fail like that."""
    code = new_code_cell(source)
    if raises:
        kind, message = raises
        code.metadata["tags"] = ["raises-exception"]
        code.metadata["expected_error"] = {"type": kind, "message": message}
    return code


def make(dest: Path, notebooks: dict[str, list], config_edit=None) -> Path:
    """A book at dest: an intro page and notebooks/<name>.ipynb for each entry."""
    nbcheck.repo_copy(dest, MACHINERY)
    for part in ("_ext", "_static", "references.bib", "error-explanations.yml"):
        source = nbcheck.ROOT / "book" / part
        target = dest / "book" / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.write_bytes(source.read_bytes())
    (dest / "book" / "intro.md").write_text("# A small book\n\nFor the tests.\n", "utf-8")
    chapters = "".join(f"  - file: notebooks/{name}\n" for name in notebooks)
    (dest / "_toc.yml").write_text(
        f"format: jb-book\nroot: book/intro\nchapters:\n{chapters}", "utf-8"
    )
    (dest / "notebooks").mkdir(exist_ok=True)
    for name, cells in notebooks.items():
        nb = new_notebook(
            cells=[new_markdown_cell(f"# {name}"), *cells], metadata={"kernelspec": KERNELSPEC}
        )
        for number, each in enumerate(nb.cells):
            each.id = f"cell-{number}"  # fixed, as in a committed notebook
        nbformat.write(nb, dest / "notebooks" / f"{name}.ipynb")
    if config_edit:
        config = dest / "_config.yml"
        config.write_text(config_edit(config.read_text("utf-8")), "utf-8")
    return dest


def run(dest: Path, *command: str) -> subprocess.CompletedProcess:
    """A command in the small book's folder; stdout and stderr together in .stdout."""
    return subprocess.run(
        list(command), cwd=dest, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def make_book(dest: Path) -> subprocess.CompletedProcess:
    return run(dest, "make", "--no-print-directory", "book")
