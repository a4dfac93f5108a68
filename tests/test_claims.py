"""The claims map: each Summary bullet links to a section whose check can fail."""

import nbformat
import pytest
import yaml

import claims
import nbcheck

NOTEBOOKS = nbcheck.toc_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]
CHEATSHEET = nbcheck.ROOT / "book" / "cheatsheet.ipynb"
EXPLANATIONS = nbcheck.ROOT / "book" / "error-explanations.yml"
# The sections that run the source posts' examples (DESIGN.md, section 3).
SEED_LABELS = [
    *(f"seed-001-e{n}" for n in range(1, 8)),
    "seed-002-e1",
    "seed-002-e2",
    "seed-002-e3",
    "seed-000-e1",
    "seed-000-e1c",
    "seed-000-e2",
    "seed-000-e2b",
]


@pytest.fixture(scope="module")
def book():
    return claims.read_book(NOTEBOOKS)


def test_labels_are_unique(book):
    assert book.duplicates == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_summary_bullet_links_to_its_proof(chapter, book):
    assert claims.summary_problems(chapter, book) == []


def test_every_cheatsheet_line_links_to_its_proof(book):
    assert CHEATSHEET in NOTEBOOKS
    assert claims.cheatsheet_problems(CHEATSHEET, book) == []


def test_every_error_explanation_links_to_its_proof(book):
    explanations = yaml.safe_load(EXPLANATIONS.read_text("utf-8"))
    assert claims.explanation_problems(explanations, book) == []


def test_every_seed_example_has_its_labelled_section(book):
    missing = [label for label in SEED_LABELS if label not in book.sections]
    assert missing == []
    assert [label for label in SEED_LABELS if book.sections[label].checks == 0] == []


def _notebook(tmp_path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_check_catches_each_kind_of_broken_claim(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    declared = code("1 / 0")
    declared.metadata["expected_error"] = {"type": "ZeroDivisionError", "message": "x"}
    path = _notebook(
        tmp_path,
        [
            md("(proved)=\n## Proved\n"),
            code("x = 1"),
            md("### A subsection\n"),
            code("assert x == 1"),
            md("(errors)=\n## Errors\n"),
            declared,
            md("(unproved)=\n## Unproved\n"),
            code("print(2)  # prints, cannot fail"),
            md("(later-check)=\n## Heading\n\n## Next heading\n"),
            code("assert True  # belongs to 'Next heading', not to 'later-check'"),
            md(
                "## Summary\n\n"
                "- fine {ref}`proved` and {ref}`the error <errors>`\n"
                "- no link at all\n"
                "- a link {ref}`to nowhere <missing>`\n"
                "- a link to a section {ref}`without <unproved>` a check\n"
                "- a section whose check sits\n  under the next heading {ref}`later-check`\n"
            ),
        ],
    )
    book = claims.read_book([path])
    problems = claims.summary_problems(path, book)
    assert len(problems) == 4, problems
    assert "bullet 2: no {ref} link" in problems[0]
    assert "'missing', which labels no section" in problems[1]
    assert "'unproved' (Unproved) holds no check" in problems[2]
    assert "'later-check' (Heading) holds no check" in problems[3]
    assert book.sections["proved"].checks == 1  # the subsection's check counts


def test_a_notebook_without_summary_is_reported(tmp_path):
    path = _notebook(tmp_path, [nbformat.v4.new_markdown_cell("# Title\n")])
    assert claims.summary_problems(path, claims.read_book([path])) == [
        "probe.ipynb: no Summary bullets found"
    ]


def test_several_labels_may_name_one_heading(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    path = _notebook(tmp_path, [md("(first)=\n(second)=\n## Shared\n"), code("assert True")])
    book = claims.read_book([path])
    assert book.sections["first"].title == book.sections["second"].title == "Shared"
    assert book.sections["first"].checks == book.sections["second"].checks == 1


def test_a_label_inside_a_going_deeper_box_names_the_box(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    path = _notebook(
        tmp_path,
        [
            md("(outer)=\n## Outer\n"),
            md(":::{going-deeper-start} a sweep\n:::"),
            md("(boxed)=\nThe sweep, over every case:\n"),
            code("assert True  # inside the box: counts for both"),
            md(":::{going-deeper-end}\n:::"),
            code("assert True  # after the box: counts for 'outer' only"),
            md("(stray)=\nA label on a paragraph outside a box names nothing.\n"),
        ],
    )
    book = claims.read_book([path])
    assert book.sections["boxed"].title == "a sweep"
    assert book.sections["boxed"].checks == 1
    assert book.sections["outer"].checks == 2
    assert "stray" not in book.sections


def test_the_cheatsheet_check_catches_each_kind_of_broken_line(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    path = _notebook(
        tmp_path,
        [
            md("# Cheat sheet\n\nAn introduction, not a line.\n"),
            md("(proved)=\n## Proved\n\nA tool, proved {ref}`here <proved>`.\n"),
            code("assert 1 + 1 == 2"),
            md("(unproved)=\n## Unproved\n\nA tool with no link.\n\nA link {ref}`nowhere`.\n"),
            code("print('no check')"),
            md("## Other\n\nA link to a section {ref}`without a check <unproved>`.\n"),
        ],
    )
    book = claims.read_book([path])
    assert claims.cheatsheet_lines(path)[0] == "A tool, proved {ref}`here <proved>`."
    problems = claims.cheatsheet_problems(path, book)
    assert len(problems) == 3, problems
    assert "line 2: no {ref} link" in problems[0]
    assert "line 3: link to 'nowhere', which labels no section" in problems[1]
    assert "line 4: 'unproved' (Unproved) holds no check" in problems[2]


def test_the_explanation_check_catches_each_kind_of_missing_proof(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    path = _notebook(
        tmp_path,
        [md("(proved)=\n## Proved\n"), code("assert True"), md("(bare)=\n## Bare\n")],
    )
    book = claims.read_book([path])
    explanations = {
        "Fine": {"meaning": "m", "proof": ["proved"]},
        "No proof key": {"meaning": "m"},
        "Unknown label": {"meaning": "m", "proof": ["proved", "gone"]},
        "Label without a check": {"meaning": "m", "proof": ["bare"]},
    }
    problems = claims.explanation_problems(explanations, book)
    assert len(problems) == 3, problems
    assert "'No proof key': no 'proof' list" in problems[0]
    assert "link to 'gone', which labels no section" in problems[1]
    assert "'bare' (Bare) holds no check" in problems[2]
