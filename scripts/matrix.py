"""`make matrix`: run every chapter on the newest torch the package index offers.

1. A second environment, ``.venv-matrix/``: the book's pins (requirements.txt) with
   torch unpinned and upgraded, so it holds the newest torch pip can find and every
   other package exactly as in the book's own environment. On PyPI that is a CUDA
   build of several GB (it runs on the CPU when there is no GPU).
2. Every notebook of _toc.yml executed there, into its own execution cache
   (``_build/matrix/.jupyter_cache``), with every cell run even after an error, so
   that each difference is seen, not just the first.
3. Each code cell's outputs compared with the pinned build's (``make book``'s
   execution cache), after the normalisations every build makes: streams joined,
   memory addresses numbered, and each environment's own torch version string
   replaced by a placeholder (the chapters print it).
4. The result written to ``book/torch-matrix.json`` (commit it): the date, the
   commit, both torch versions, each chapter's code hash at the time and every
   difference by chapter and cell. The introduction's "verified with" line is made
   from this file (book/_ext/build_stamp.py), never typed. A readable report goes
   to ``_build/matrix/report.md``.

Exits 1 when any output differs or a chapter could not run.
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import torch
from jupyter_cache import get_cache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "scripts"))
from book_inputs import execution_inputs, toc_notebooks  # noqa: E402
from stable_outputs import AddressNumbers  # noqa: E402

VENV = ROOT / ".venv-matrix"
WORK = ROOT / "_build" / "matrix"
RESULT = ROOT / "book" / "torch-matrix.json"
PINNED_CACHE = ROOT / "_build" / ".jupyter_cache"
SHOWN = 1500  # characters of each side shown for a difference


def say(message: str) -> None:
    print(f"matrix: {message}", flush=True)


def ensure_environment() -> Path:
    """.venv-matrix with the book's pins and the newest torch; its python."""
    python = VENV / "bin" / "python"
    if not (VENV / ".created").is_file():
        base = os.environ.get("PYTHON", "python3")
        say(f"creating {VENV.name} with {base}")
        subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True)
        (VENV / ".created").touch()
    WORK.mkdir(parents=True, exist_ok=True)
    pins = (ROOT / "requirements.txt").read_text("utf-8").splitlines()
    unpinned = [line for line in pins if not line.lower().startswith("torch==")]
    requirements = WORK / "requirements-matrix.txt"
    requirements.write_text("\n".join([*unpinned, "torch"]) + "\n", "utf-8")
    say("installing the book's pins with the newest torch (the first time: several GB)")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--upgrade", "-r", requirements],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # as scripts/setup-env: drop the noise of find-links folders that do not exist
    noise = "is ignored: it is neither a file nor a directory"
    print("".join(line for line in pip.stdout.splitlines(True) if noise not in line), end="")
    if pip.returncode != 0:
        raise SystemExit("matrix: pip could not install the matrix environment (see above)")
    return python


def torch_in(python: Path) -> dict:
    code = (
        "import json, platform, torch;"
        "print(json.dumps({'torch': torch.__version__, 'python': platform.python_version()}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def kernel_torch(python: Path) -> str:
    """The torch a notebook kernel started from this python imports, as the build starts it."""
    code = (
        "import nbformat, nbclient;"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("
        "'import torch; print(torch.__version__, end=\"\")')],"
        " metadata={'kernelspec': {'name': 'python3', 'display_name': 'Python 3',"
        " 'language': 'python'}});"
        "nbclient.execute(nb, cwd='notebooks');"
        "print(nb.cells[0].outputs[0].text)"
    )
    out = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or out.stderr[-2000:]


def comparable(nb, versions: list[str]) -> list[list[str]]:
    """Each code cell's outputs as text, normalised as every build normalises them."""
    numbers = AddressNumbers()
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        streams: dict[str, str] = {}
        texts = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                streams[out.name] = streams.get(out.name, "") + out.text
            elif out.output_type == "error":
                texts.append(f"error: {out.ename}: {out.evalue}")
            else:
                for mime in sorted(out.get("data", {})):
                    data = out.data[mime]
                    texts.append(f"{mime}: {data if isinstance(data, str) else json.dumps(data)}")
        texts += [f"{name}: {text}" for name, text in sorted(streams.items())]
        normalised = []
        for text in texts:
            for version in versions:
                text = text.replace(version, "<torch version>")
            normalised.append(numbers(text))
        cells.append(normalised)
    return cells


def executed_from(cache_path: Path, path: Path):
    cache = get_cache(cache_path)
    _, merged = cache.merge_match_into_notebook(nbformat.read(path, as_version=4))
    return merged


def first_line(nb, code_index: int) -> str:
    cell = [c for c in nb.cells if c.cell_type == "code"][code_index]
    lines = [line.strip() for line in cell.source.splitlines() if line.strip()]
    return lines[0][:80] if lines else ""


def compare(path: Path, pinned_versions: list[str], other_versions: list[str]) -> dict:
    """One chapter: the pinned build's outputs against the matrix run's, cell by cell."""
    pinned_nb = executed_from(PINNED_CACHE, path)
    other_nb = executed_from(WORK / ".jupyter_cache", path)
    ours, theirs = comparable(pinned_nb, pinned_versions), comparable(other_nb, other_versions)
    cell_numbers = [i for i, c in enumerate(pinned_nb.cells) if c.cell_type == "code"]
    differences = []
    for code_index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            pinned_text, other_text = "\n".join(a), "\n".join(b)
            diff = difflib.unified_diff(
                pinned_text.splitlines(), other_text.splitlines(), "pinned", "matrix", lineterm=""
            )
            differences.append(
                {
                    "cell": cell_numbers[code_index],
                    "first_line": first_line(pinned_nb, code_index),
                    "diff": "\n".join(diff)[: 2 * SHOWN],
                }
            )
    return {"code_cells": len(ours), "differences": differences}


def git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def report(result: dict) -> str:
    run = result["runs"][0]
    lines = [
        f"# torch matrix, {result['date']}",
        "",
        f"Pinned torch {result['pinned']['torch']} against torch {run['torch']} "
        f"(Python {run['python']}), commit {result['commit'] or 'unknown'}"
        f"{' with uncommitted changes' if result['uncommitted_changes'] else ''}.",
        "",
        "| chapter | code cells | differing cells |",
        "|---|---|---|",
    ]
    for name, chapter in run["chapters"].items():
        lines.append(f"| {name} | {chapter['code_cells']} | {len(chapter['differences'])} |")
    lines += ["", f"Matched: {'yes' if run['matched'] else 'no'}."]
    for name, failure in run["failed"].items():
        lines += ["", f"## {name} could not run", "", "```", failure[:3000], "```"]
    for name, chapter in run["chapters"].items():
        for diff in chapter["differences"]:
            lines += ["", f"## {name}, cell {diff['cell']} ({diff['first_line']})", ""]
            lines += ["```diff", diff["diff"], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    if not (PINNED_CACHE / "global.db").is_file():
        say("no pinned build to compare with: run make book first")
        return 1
    pinned = {"torch": torch.__version__}
    python = ensure_environment()
    other = torch_in(python)
    say(f"pinned torch {pinned['torch']}, matrix torch {other['torch']}")
    in_kernel = kernel_torch(python)
    if in_kernel != other["torch"]:
        say(f"the matrix kernel imports torch {in_kernel!r}, not {other['torch']}: stopping")
        return 1
    if other["torch"] == pinned["torch"]:
        say("the package index offers no torch newer than the pin; running it all the same")
    cache = WORK / ".jupyter_cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    say("executing every chapter with the matrix torch")
    execution = subprocess.run(
        [python, ROOT / "scripts" / "execute_chapters.py", "--cache", cache, "--allow-errors"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (WORK / "execution.log").write_text(execution.stdout + execution.stderr, "utf-8")

    def spellings(version: str) -> list[str]:
        return [version, version.split("+")[0]]

    chapters, failed = {}, {}
    inputs = execution_inputs(ROOT)
    for path in toc_notebooks(ROOT):
        name = str(path.relative_to(ROOT))
        try:
            chapters[name] = compare(path, spellings(pinned["torch"]), spellings(other["torch"]))
        except KeyError:
            failed[name] = "no executed copy in one of the caches; see _build/matrix/execution.log"
            continue
        chapters[name]["hash"] = inputs["notebooks"].get(name)
    if execution.returncode != 0:
        failed.setdefault("execution", (execution.stdout + execution.stderr)[-3000:])
    matched = not failed and not any(c["differences"] for c in chapters.values())
    result = {
        "date": datetime.date.today().isoformat(),
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "pinned": pinned,
        "helpers": inputs["helpers"],
        "runs": [
            {
                "torch": other["torch"],
                "python": other["python"],
                "matched": matched,
                "chapters": chapters,
                "failed": failed,
            }
        ],
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n", "utf-8")
    (WORK / "report.md").write_text(report(result), "utf-8")
    differing = sum(len(c["differences"]) for c in chapters.values())
    say(
        f"torch {other['torch']}: {'every output matched' if matched else 'DIFFERENCES'}"
        f" ({sum(c['code_cells'] for c in chapters.values())} code cells in "
        f"{len(chapters)} notebooks, {differing} differing, {len(failed)} failed)"
    )
    say(f"result: {RESULT.relative_to(ROOT)} (commit it); report: {WORK / 'report.md'}")
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
