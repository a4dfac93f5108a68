"""`make lint` fails on a notebook committed with outputs."""

import subprocess

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

import nbcheck


def lint_copy(tmp_path):
    """A copy of what `make lint` reads, sharing the real .venv."""
    names = [
        "Makefile",
        "ruff.toml",
        "pyproject.toml",
        "_config.yml",
        "src",
        "requirements.txt",
        "requirements-dev.txt",
        "requirements-lab.txt",
        "scripts",
        "tests",
        "notebooks",
        "book",
    ]
    return nbcheck.repo_copy(tmp_path, names)


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
