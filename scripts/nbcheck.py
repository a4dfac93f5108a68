"""Checks on the book's notebooks, shared by the tests, `make lint` and `make bench`.

It lives in scripts/ because scripts run it; the tests import it from here.

A cell that is meant to fail carries the ``raises-exception`` tag *and* declares
what it must raise, in its metadata::

    "expected_error": {"type": "RuntimeError", "message": "<the exact message>"}

``problems_in_executed(nb)`` compares an executed notebook with those declarations:
a declared cell must fail with exactly that type and message, every other cell
must not fail at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import yaml
from bs4 import BeautifulSoup
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_NOTEBOOK_METADATA = {"kernelspec", "language_info"}
ALLOWED_CELL_METADATA = {"tags", "expected_error"}


def toc_files(root: Path = ROOT) -> list[str]:
    """Every file named in _toc.yml (root first), without its suffix, in order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return files


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks listed in _toc.yml, in reading order."""
    return [root / f"{f}.ipynb" for f in toc_files(root) if (root / f"{f}.ipynb").exists()]


def chapter_notebooks(root: Path = ROOT) -> list[Path]:
    """Every chapter in notebooks/, listed in _toc.yml or not ('_' files are not chapters)."""
    return sorted(p for p in (root / "notebooks").glob("*.ipynb") if not p.name.startswith("_"))


def notebooks_to_run(root: Path = ROOT) -> list[Path]:
    """The book's notebooks in reading order, then any chapter _toc.yml forgot."""
    listed = toc_notebooks(root)
    return listed + [p for p in chapter_notebooks(root) if p not in listed]


def html(path: Path) -> BeautifulSoup:
    """A built page, parsed."""
    return BeautifulSoup(Path(path).read_text(encoding="utf-8"), "html.parser")


def built_page(html_root: Path, notebook_or_doc: Path | str) -> BeautifulSoup:
    """The built page of a docname ('book/intro') or of a source notebook path."""
    doc = Path(notebook_or_doc)
    if doc.is_absolute():
        doc = doc.relative_to(ROOT)
    return html(html_root / doc.with_suffix(".html"))


def repo_copy(dest: Path, names: list[str]) -> Path:
    """Copy these top-level files and folders of the repository into ``dest``, sharing .venv."""
    for name in names:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "_build")
            shutil.copytree(ROOT / name, dest / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def clone_copy(dest: Path) -> Path:
    """The repository as a fresh clone of this work tree would hold it, sharing .venv.

    Tracked files and new files not ignored by git, as they are now in the work tree.
    """
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def where(nb_path: Path | str, index: int, cell) -> str:
    """'notebook, cell N (first line of code)': how problems name a cell."""
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    return f"{Path(nb_path).name}, cell {index} ({first.strip()[:60]!r})"


def declaration_problems(cell) -> list[str]:
    """What is wrong with a cell's expected-error declaration itself (if any)."""
    tagged = "raises-exception" in cell.metadata.get("tags", [])
    declared = cell.metadata.get("expected_error")
    if tagged and declared is None:
        return ["tagged raises-exception but declares no expected_error {type, message}"]
    if declared is not None and not tagged:
        return ["declares expected_error but lacks the raises-exception tag"]
    if declared is None:
        return []
    if not isinstance(declared, dict) or set(declared) != {"type", "message"}:
        return [f"expected_error must be exactly {{type, message}}, got {declared!r}"]
    if not all(isinstance(v, str) and v for v in declared.values()):
        return ["expected_error type and message must be non-empty strings"]
    return []


def problems_in_executed(nb, nb_path: Path | str = "notebook") -> list[str]:
    """Every mismatch between an executed notebook's errors and its declarations."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        name = where(nb_path, index, cell)
        bad_declaration = declaration_problems(cell)
        problems += [f"{name}: {p}" for p in bad_declaration]
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        declared = cell.metadata.get("expected_error")
        if bad_declaration or declared is None:
            problems += [f"{name}: unexpected {e.ename}: {e.evalue}" for e in errors]
            continue
        if not errors:
            problems.append(f"{name}: expected {declared['type']} but the cell raised nothing")
            continue
        (error,) = errors
        if error.ename != declared["type"]:
            problems.append(
                f"{name}: expected {declared['type']}, raised {error.ename}: {error.evalue}"
            )
        elif error.evalue != declared["message"]:
            problems.append(
                f"{name}: {error.ename} message differs\n"
                f"  declared: {declared['message']!r}\n  raised:   {error.evalue!r}"
            )
    return problems


def cell_timeout(root: Path = ROOT) -> int:
    """Seconds per cell: the same limit the book build uses (_config.yml)."""
    return yaml.safe_load((root / "_config.yml").read_text("utf-8"))["execute"]["timeout"]


def execute(nb_path: Path, timeout: int | None = None):
    """Run a notebook top to bottom on a fresh kernel, from its own folder.

    Errors do not stop the run: every cell runs, so ``problems_in_executed`` can
    report all of them at once.
    """
    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout or cell_timeout(),
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(nb_path.parent)}},
    )
    client.execute()
    return nb


def stored_state_problems(nb, nb_path: Path | str = "notebook") -> list[str]:
    """What a committed notebook must not carry: outputs, counts, stray metadata."""
    problems = []
    extra = set(nb.metadata) - ALLOWED_NOTEBOOK_METADATA
    if extra:
        problems.append(f"{Path(nb_path).name}: notebook metadata not allowed: {sorted(extra)}")
    for index, cell in enumerate(nb.cells):
        name = where(nb_path, index, cell)
        if cell.cell_type == "code":
            if cell.outputs:
                problems.append(f"{name}: has outputs (clear them before committing)")
            if cell.execution_count is not None:
                problems.append(f"{name}: has an execution count")
        extra = set(cell.metadata) - ALLOWED_CELL_METADATA
        if extra:
            problems.append(f"{name}: cell metadata not allowed: {sorted(extra)}")
    return problems


# What differs between two correct runs: object addresses, and the file names
# IPython gives each cell (they appear in warnings).
_VOLATILE = [
    (re.compile(r" at 0x[0-9a-f]+"), " at 0x?"),
    (re.compile(r"/ipykernel_\d+/\d+\.py"), "/ipykernel/cell.py"),
]


def _mask(text: str) -> str:
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def comparable_outputs(nb) -> list[list[str]]:
    """Each code cell's outputs as text, for run-to-run comparison.

    Streams are joined per name (a kernel may split a print into several chunks)
    and what legitimately varies is masked; everything else must match exactly.
    """
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        streams = {"stdout": "", "stderr": ""}
        texts = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                streams[out.name] += out.text
            elif out.output_type == "error":
                texts.append(f"error:{out.ename}:{out.evalue}")
            else:
                texts.extend(f"{mime}:{out.data[mime]}" for mime in sorted(out.get("data", {})))
        texts += [f"{name}:{text}" for name, text in streams.items() if text]
        cells.append([_mask(t) for t in texts])
    return cells
