"""The expected-error checker must catch every way a declaration can be wrong."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

import nbcheck

FIXTURE = Path(__file__).parent / "fixtures" / "wrong_declarations.ipynb"


def test_checker_flags_every_wrong_cell_and_only_those():
    nb = nbcheck.execute(FIXTURE)
    problems = nbcheck.problems_in_executed(nb, FIXTURE)
    flagged = {int(p.split("cell ")[1].split(" ")[0]) for p in problems}
    bad = {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "# BAD" in c.source}
    assert len(bad) == 7
    assert flagged == bad, "\n".join(problems)


def test_checker_names_what_is_wrong():
    nb = nbcheck.execute(FIXTURE)
    text = "\n".join(nbcheck.problems_in_executed(nb, FIXTURE))
    assert "expected ValueError, raised KeyError" in text  # wrong type
    assert "message differs" in text and "another message" in text  # wrong message
    assert "unexpected ValueError: nobody declared this" in text  # untagged error
    assert "raised nothing" in text  # tagged, no error
    assert "declares no expected_error" in text  # tag without declaration
    assert "lacks the raises-exception tag" in text  # declaration without tag
    assert "wrong_declarations.ipynb, cell 2" in text  # names notebook and cell


def test_correct_declaration_passes():
    nb = nbcheck.execute(FIXTURE)
    nb.cells = nb.cells[:2] + nb.cells[-1:]
    assert nbcheck.problems_in_executed(nb, FIXTURE) == []


def test_stored_state_flags_outputs_counts_and_metadata():
    cell = new_code_cell("1 + 1", execution_count=3, metadata={"collapsed": True})
    cell.outputs = [new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]
    nb = new_notebook(
        cells=[cell],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}, "widgets": {}},
    )
    problems = "\n".join(nbcheck.stored_state_problems(nb, "dirty.ipynb"))
    assert "has outputs" in problems
    assert "execution count" in problems
    assert "cell metadata not allowed: ['collapsed']" in problems
    assert "notebook metadata not allowed: ['widgets']" in problems


def test_fixture_itself_is_stored_clean():
    nb = nbformat.read(FIXTURE, as_version=4)
    assert nbcheck.stored_state_problems(nb, FIXTURE) == []
