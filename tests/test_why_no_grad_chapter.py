"""Chapter 7 and gradstop.diagnosis check each other.

The chapter's symptom table groups the causes by what the reader sees; each row names,
in parentheses, the reason code the tool gives for it, and links the section with the
bug and the fix. That section must assert the code. Every reason code must be
asserted somewhere in the chapter, so no code of the tool goes undemonstrated.
"""

import json
import re
import subprocess
import sys

import nbformat

import claims
import nbcheck
from gradstop import Reason

CHAPTER = nbcheck.ROOT / "notebooks" / "07-why-no-grad.ipynb"
CODE = re.compile(r"`([A-Z_]+)`")
GROUPS = [
    "`None`, with a warning",
    "`None`, silently",
    "An error",
    "There, but wrong or zero",
    "The weights do not change",
]


def code_by_section(path) -> dict[str, str]:
    """The code of each labelled section (subsections included), by label."""
    nb = nbformat.read(path, as_version=4)
    found: dict[str, list[str]] = {}
    open_sections: list[tuple[str, int]] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            pending: list[str] = []
            for line in cell.source.splitlines():
                label, heading = claims.LABEL.match(line), claims.HEADING.match(line)
                if label:
                    pending.append(label["label"])
                elif heading:
                    level = len(heading["hashes"])
                    open_sections = [(s, lv) for s, lv in open_sections if lv < level]
                    for name in pending:
                        open_sections.append((name, level))
                        found[name] = []
                    pending = []
        else:
            for label, _ in open_sections:
                found[label].append(cell.source)
    return {label: "\n".join(code) for label, code in found.items()}


def symptom_table(path) -> list[list[str]]:
    """The table's rows, as cells: what you see (on a group's first row), the cause."""
    nb = nbformat.read(path, as_version=4)
    text = next(c.source for c in nb.cells if "## Find your symptom" in c.source)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "{ref}" in line]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def symptom_rows(path) -> list[tuple[list[str], list[str]]]:
    """(reason codes, section labels) of each row of the symptom table."""
    return [(CODE.findall(cause), claims.refs_in(cause)) for _, cause in symptom_table(path)]


def asserted(code: str, reason: str) -> bool:
    """Does a check in ``code`` name ``reason`` (as Reason.X or as "X")?"""
    checks = [line for line in code.splitlines() if "assert" in line or "==" in line]
    return any(f"Reason.{reason}" in c or f'"{reason}"' in c for c in checks)


def test_each_symptom_row_names_a_code_its_section_asserts():
    sections = code_by_section(CHAPTER)
    rows = symptom_rows(CHAPTER)
    assert len(rows) >= 20
    problems = []
    for codes, labels in rows:
        assert codes and labels, (codes, labels)
        for code in codes:
            assert code in Reason.__members__, code
            if not any(asserted(sections.get(label, ""), code) for label in labels):
                problems.append(f"{code} is not asserted in {labels}")
    assert problems == []


def test_the_table_is_grouped_by_what_the_reader_sees_each_group_numbered():
    table = symptom_table(CHAPTER)
    groups = [row[0].strip("*") for row in table if row[0]]
    assert groups == GROUPS
    numbers = []
    for see, cause in table:
        numbers = [] if see else numbers
        numbers.append(int(cause.split(".")[0]))
        assert numbers == list(range(1, len(numbers) + 1)), cause  # "check in this order"


def test_every_reason_code_is_asserted_in_the_chapter():
    nb = nbformat.read(CHAPTER, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert [r.name for r in Reason if not asserted(code, r.name)] == []


def test_the_check_catches_a_row_whose_section_asserts_another_code(tmp_path):
    nb = nbformat.read(CHAPTER, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = cell.source.replace("Reason.NOT_FLOAT", "Reason.OK")
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    sections = code_by_section(broken)
    row = next(r for r in symptom_rows(broken) if r[0] == ["NOT_FLOAT"])
    assert not asserted(sections[row[1][0]], "NOT_FLOAT")


def test_each_section_asks_the_tool_once_on_the_readers_path():
    nb = nbformat.read(CHAPTER, as_version=4)
    calls = re.compile(r"gp\.(why_no_grad|grad_report|diagnose_step)\(")
    seen: dict[str, int] = {}
    label = pending = None
    folded = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if found := claims.LABEL.match(line):
                    pending = found["label"]
                elif claims.HEADING.match(line):
                    label, pending = pending, None
            folded = "going-deeper-start" in cell.source or (
                folded and "going-deeper-end" not in cell.source
            )
            continue
        shown = not ({"check", "hide-input", "remove-cell"} & set(cell.metadata.get("tags", [])))
        if label and shown and not folded:
            seen[label] = seen.get(label, 0) + len(calls.findall(cell.source))
    assert len(seen) >= 20
    assert {label: n for label, n in seen.items() if n != 1} == {}


ERRORS_PAGE = nbcheck.ROOT / "book" / "errors.md"


WARNINGS = """
import json, warnings, torch
w = torch.randn(3, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.tensor(w)
    float(w.sum())
    (w * 2).grad
    torch.utils.checkpoint.checkpoint(torch.nn.Linear(3, 1), torch.ones(3), use_reentrant=True)
print(json.dumps([str(c.message) for c in caught]))
"""


def warnings_torch_gives() -> list[str]:
    """The warnings the chapter meets, as today's PyTorch words them.

    In a fresh Python: some come once per process, and this test's own process may
    have had its one already.
    """
    run = subprocess.run([sys.executable, "-c", WARNINGS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_each_warning_in_the_error_index_is_one_torch_gives_and_links_to_chapter_7():
    rows = [line for line in ERRORS_PAGE.read_text("utf-8").splitlines() if line.startswith("| `")]
    assert len(rows) == 4
    given = warnings_torch_gives()
    code = code_by_section(CHAPTER)
    for row in rows:
        start = row.split("`")[1]
        assert any(message.startswith(start) for message in given), start
        labels = claims.refs_in(row)
        assert labels and all(label in code for label in labels), row
