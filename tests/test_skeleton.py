"""Every chapter follows the skeleton of notebooks/_chapter-template.ipynb."""

import re

import nbformat
import pytest

import nbcheck
import setup_cell

TEMPLATE = nbcheck.ROOT / "notebooks" / "_chapter-template.ipynb"
CHAPTERS = [p for p in nbcheck.notebooks_to_run() if p.parent.name == "notebooks"]
IN_ORDER = ["## Overview", "## Exercises", "## Summary", "## Further reading"]


def skeleton_problems(path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    headings = re.findall(r"^##? .*$", markdown, re.M)
    problems = []
    if not headings or not headings[0].startswith("# "):
        problems.append("does not open with a '# ' title")
    if headings.count("## Overview") != 1:
        problems.append("needs exactly one '## Overview'")
    positions = [headings.index(h) if h in headings else -1 for h in IN_ORDER]
    if -1 in positions or positions != sorted(positions):
        problems.append(f"needs, in this order: {', '.join(IN_ORDER)}")
    elif positions[1] - positions[0] < 2:
        problems.append("needs at least one section between Overview and Exercises")
    overview = markdown.split("## Overview", 1)[-1].split("\n## ", 1)[0]
    for part in ("What you will learn", "Prerequisites"):
        if part not in overview:
            problems.append(f"the overview lacks '{part}'")
    # The setup cell comes first (scripts/setup_cell.py); then the imports and the seed.
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    first_code = next((source for source in code if source != setup_cell.source()), "")
    if "import torch" not in first_code or "manual_seed" not in first_code:
        problems.append("the first code cell must import and seed (torch.manual_seed)")
    if markdown.count("{exercise}") < 3 or markdown.count("{solution-start}") < 3:
        problems.append("needs at least three {exercise}s, each with a {solution-start}")
    return problems


@pytest.mark.parametrize("path", [TEMPLATE, *CHAPTERS], ids=lambda p: p.name)
def test_follows_the_skeleton(path):
    assert skeleton_problems(path) == []


def test_skeleton_check_catches_a_chapter_without_exercises(tmp_path):
    nb = nbformat.read(TEMPLATE, as_version=4)
    nb.cells = [c for c in nb.cells if "Exercises" not in c.source and "exercise" not in c.source]
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    assert any("in this order" in p for p in skeleton_problems(broken))


def test_template_is_not_in_the_book():
    assert TEMPLATE not in nbcheck.toc_notebooks()


def test_template_runs_clean():
    nb = nbcheck.execute(TEMPLATE)
    assert nbcheck.problems_in_executed(nb, TEMPLATE) == []


def test_chapters_have_three_exercises_with_checked_solutions():
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert markdown.count("{exercise}") >= 3, path.name
        solutions = markdown.split("## Exercises", 1)[1]
        assert solutions.count("{solution-start}") == markdown.count("{exercise}"), path.name
        start = next(i for i, c in enumerate(nb.cells) if "## Exercises" in c.source)
        solution_code = [c.source for c in nb.cells[start:] if c.cell_type == "code"]
        assert all("assert" in code for code in solution_code), path.name
