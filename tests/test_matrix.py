"""make matrix: what it compares, and the intro line made from its result."""

import json
import sys

from nbformat.v4 import new_code_cell, new_notebook, new_output

import nbcheck

sys.path.insert(0, str(nbcheck.ROOT / "scripts"))
sys.path.insert(0, str(nbcheck.ROOT / "book" / "_ext"))
import matrix  # noqa: E402

import build_stamp  # noqa: E402
from book_inputs import execution_inputs  # noqa: E402

ROOT = nbcheck.ROOT


def executed(*outputs_per_cell):
    nb = new_notebook(cells=[new_code_cell("x") for _ in outputs_per_cell])
    for cell, outputs in zip(nb.cells, outputs_per_cell, strict=True):
        cell.outputs = outputs
    return nb


def test_outputs_compare_equal_across_torch_versions_and_addresses_only():
    def run(version, address, value):
        return executed(
            [new_output("stream", name="stdout", text=f"torch {version}\n")],
            [
                new_output("stream", name="stdout", text=f"<AddBackward0 object at {address}>"),
                new_output("stream", name="stdout", text="\n"),
            ],
            [new_output("execute_result", data={"text/plain": value}, execution_count=3)],
        )

    pinned = matrix.comparable(run("2.13.0+cpu", "0x7f01", "tensor([3., 18., 7.])"), ["2.13.0+cpu"])
    same = matrix.comparable(run("2.14.1", "0x55aa", "tensor([3., 18., 7.])"), ["2.14.1"])
    other = matrix.comparable(run("2.14.1", "0x55aa", "tensor([3., 10., 7.])"), ["2.14.1"])
    assert pinned == same
    assert [a == b for a, b in zip(pinned, other, strict=True)] == [True, True, False]


def result_with(run: dict) -> dict:
    inputs = execution_inputs(ROOT)
    return {"date": "2026-01-02", "helpers": inputs["helpers"], "runs": [run]}


def matched_run(inputs, changed=()):
    chapters = {
        name: {"hash": "edited" if name in changed else key, "code_cells": 1, "differences": []}
        for name, key in inputs["notebooks"].items()
    }
    return {
        "torch": "2.14.1+cu130",
        "python": "3.11.7",
        "matched": True,
        "chapters": chapters,
        "failed": {},
    }


def test_intro_line_lists_versions_from_the_matrix_result(tmp_path):
    inputs = execution_inputs(ROOT)
    ours = f"torch {build_stamp.stamp_values()['torch_version']} (this build)"
    result = tmp_path / "torch-matrix.json"

    result.write_text(json.dumps(result_with(matched_run(inputs))))
    line = build_stamp.verified_with(ROOT, result)
    assert line == f"{ours} and torch 2.14.1 (`make matrix` of 2026-01-02: every output the same)."

    edited = "notebooks/02-detach.ipynb"
    result.write_text(json.dumps(result_with(matched_run(inputs, changed=[edited]))))
    line = build_stamp.verified_with(ROOT, result)
    assert "chapters changed since: 02-detach)" in line
    assert line.startswith(f"{ours} and torch 2.14.1 for an earlier version of the book (")

    # every chapter changed, or the helper code: the old run covers no page built now
    result.write_text(json.dumps(result_with(matched_run(inputs, changed=inputs["notebooks"]))))
    old_run = (
        f"{ours}. torch 2.14.1 verified an earlier version of the book (`make matrix` of "
        "2026-01-02, every output the same); the helper code or every chapter has changed "
        "since, so that run covers no page built now."
    )
    assert build_stamp.verified_with(ROOT, result) == old_run
    helpers_moved = result_with(matched_run(inputs))
    helpers_moved["helpers"] = "an older hash"
    result.write_text(json.dumps(helpers_moved))
    assert build_stamp.verified_with(ROOT, result) == old_run

    mismatch = matched_run(inputs)
    mismatch["matched"] = False
    mismatch["chapters"][edited]["differences"] = [{"cell": 5, "first_line": "x", "diff": ""}]
    result.write_text(json.dumps(result_with(mismatch)))
    line = build_stamp.verified_with(ROOT, result)
    assert line.startswith(f"{ours}.") and "2.14.1 gave different outputs in 1 cells" in line

    assert build_stamp.verified_with(ROOT, tmp_path / "none.json") == (
        f"{ours}; no `make matrix` run is recorded."
    )


def test_the_committed_result_says_matched_only_when_nothing_differed():
    result = json.loads((ROOT / build_stamp.MATRIX_RESULT).read_text("utf-8"))
    assert {"date", "commit", "pinned", "helpers", "runs"} <= set(result)
    for run in result["runs"]:
        differing = [d for c in run["chapters"].values() for d in c["differences"]]
        assert run["matched"] == (not run["failed"] and not differing)
        assert all(c["code_cells"] > 0 for c in run["chapters"].values())
