"""`make lint` fails on a notebook committed with outputs."""

import os
import shutil
import subprocess

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

import nbcheck

ROOT = nbcheck.ROOT


def lint_copy(tmp_path):
    """A copy of what `make lint` reads, sharing the real .venv."""
    for name in (
        "Makefile",
        "ruff.toml",
        "requirements.txt",
        "requirements-dev.txt",
        "requirements-lab.txt",
    ):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("scripts", "tests", "notebooks", "book"):
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "_build")
        )
    os.symlink(ROOT / ".venv", tmp_path / ".venv")
    return tmp_path


def make_lint(repo):
    return subprocess.run(
        ["make", "--no-print-directory", "lint"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def test_lint_passes_on_the_repository_as_committed(tmp_path):
    result = make_lint(lint_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_fails_on_a_notebook_with_outputs(tmp_path):
    repo = lint_copy(tmp_path)
    cell = new_code_cell("print(1 + 1)", execution_count=1)
    cell.outputs = [new_output("stream", name="stdout", text="2\n")]
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(
        new_notebook(cells=[cell], metadata={"kernelspec": kernelspec}),
        repo / "notebooks" / "99-dirty.ipynb",
    )
    result = make_lint(repo)
    assert result.returncode != 0
    assert "99-dirty.ipynb" in result.stderr and "has outputs" in result.stderr
