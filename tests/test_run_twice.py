"""Run All twice: readers re-run notebooks without restarting the kernel.

Each chapter runs top to bottom twice in one kernel, as "Run All" and then "Run All"
again. Neither pass may raise anything outside the cells declared to fail (a check
that holds only on a fresh kernel, such as a warning PyTorch gives once per process,
fails the second pass). The chapters' own two passes run where a reader runs them:
tests/test_anywhere.py executes each downloaded chapter with RUN_TWICE below, in the
reader's environment, and checks its first pass as the download test and its second
here (test_runs_twice_in_one_kernel there), so no chapter is executed twice over for
the two promises. This file holds the script and the check that it catches a check
holding only once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import nbcheck

ROOT = nbcheck.ROOT

RUN_TWICE = """
import json, sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, sys.argv[3])
import nbcheck

path, timeout = Path(sys.argv[1]), int(sys.argv[2])
first_pass = sys.argv[4] if len(sys.argv) > 4 else ""  # where to save pass 1, executed
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
        if run == 1 and first_pass:
            nbformat.write(nb, first_pass)
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
