"""Run All twice: readers re-run notebooks without restarting the kernel.

Each chapter runs top to bottom twice in one kernel, as "Run All" and then "Run All"
again. Neither pass may raise anything outside the cells declared to fail (a check
that holds only on a fresh kernel, such as a warning PyTorch gives once per process,
fails the second pass). One kernel per chapter, both passes in it; two chapters at a
time, one per core, each in a Python of its own. The figures (seconds per chapter,
both passes) are printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import nbcheck

ROOT = nbcheck.ROOT
# The chapters, and the page of chapter 7's tool, which readers re-run as well.
NOTEBOOKS = [*nbcheck.chapter_notebooks(), ROOT / "book" / "why-no-grad-tool.ipynb"]
WORKERS = 2

RUN_TWICE = """
import json, sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, sys.argv[3])
import nbcheck

path, timeout = Path(sys.argv[1]), int(sys.argv[2])
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                        resources={"metadata": {"path": str(path.parent)}})
found = {"problems": [], "quiet": []}
with client.setup_kernel():
    for run in (1, 2):
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell.outputs = []
            client.execute_cell(cell, index)
            errors = [o for o in cell.outputs if o.output_type == "error"]
            name = nbcheck.where(path, index, cell)
            if errors and "expected_error" not in cell.metadata:
                found["problems"] += [f"pass {run}: {name}: {e.ename}: {e.evalue}" for e in errors]
            elif not errors and "expected_error" in cell.metadata:
                found["quiet"].append(f"pass {run}: {name}")
print(json.dumps(found))
"""


def run_twice(path) -> dict:
    """Both passes of one notebook in one kernel: its problems, and the seconds it took."""
    start = time.perf_counter()
    command = [sys.executable, "-c", RUN_TWICE, str(path), str(nbcheck.cell_timeout())]
    done = subprocess.run(
        [*command, str(ROOT / "scripts")], cwd=ROOT, capture_output=True, text=True
    )
    seconds = round(time.perf_counter() - start, 1)
    if done.returncode != 0:
        return {"problems": [f"the run itself failed: {done.stderr[-2000:]}"], "seconds": seconds}
    return {**json.loads(done.stdout.splitlines()[-1]), "seconds": seconds}


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        found = dict(zip(NOTEBOOKS, pool.map(run_twice, NOTEBOOKS), strict=True))
    for path, result in found.items():
        quiet = (
            f", {len(result['quiet'])} declared cell(s) raised nothing"
            if result.get("quiet")
            else ""
        )
        print(f"{path.name}: both passes in {result['seconds']} s{quiet}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_twice_in_one_kernel(runs, path):
    assert runs[path]["problems"] == []


def test_a_check_that_holds_only_once_fails_the_second_pass(tmp_path):
    # The break this test exists for: a warning PyTorch gives once per process, asserted.
    import nbformat

    once = nbformat.v4.new_notebook()
    once.cells = [
        nbformat.v4.new_code_cell(
            "import warnings, torch\n"
            "w = torch.ones(1, requires_grad=True)\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    float(w)\n"
            "assert len(caught) == 1"
        )
    ]
    path = tmp_path / "once.ipynb"
    nbformat.write(once, path)
    problems = run_twice(path)["problems"]
    assert len(problems) == 1 and problems[0].startswith("pass 2:")
    assert "AssertionError" in problems[0]
