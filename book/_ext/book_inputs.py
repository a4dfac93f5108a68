"""What the book executes, and what its outputs depend on.

Shared by scripts/execute_chapters.py (which notebooks to run), scripts/matrix.py
(what a matrix run was made from) and build_stamp.py (whether that run is still
about the chapters as they are now).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat
import yaml
from jupyter_cache.cache.main import JupyterCacheBase

# Code the chapters import: the helper module beside them, or the package in src/.
HELPER_GLOBS = ("notebooks/*.py", "src/**/*.py")


def toc_notebooks(root: Path) -> list[Path]:
    """Every .ipynb named in _toc.yml, in reading order."""
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text("utf-8"))
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    walk(toc.get("parts"))
    walk(toc.get("chapters"))
    return [Path(root) / f"{n}.ipynb" for n in names if (Path(root) / f"{n}.ipynb").is_file()]


def notebook_hash(path: Path) -> str:
    """The execution cache's key for a notebook: its code cells and kernelspec."""
    nb = nbformat.read(path, as_version=4)
    return JupyterCacheBase("unused").create_hashed_notebook(nb)[1]


def helpers_digest(root: Path) -> str:
    root = Path(root)
    digest = hashlib.sha256()
    files = sorted({p for pattern in HELPER_GLOBS for p in root.glob(pattern) if p.is_file()})
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def execution_inputs(root: Path) -> dict:
    """Each notebook's cache key, and one digest of the helper code they import."""
    root = Path(root)
    return {
        "notebooks": {str(p.relative_to(root)): notebook_hash(p) for p in toc_notebooks(root)},
        "helpers": helpers_digest(root),
    }
