"""The claims map: each Summary bullet links to a section whose check can fail."""

import nbformat
import pytest

import claims
import nbcheck

NOTEBOOKS = nbcheck.toc_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]


@pytest.fixture(scope="module")
def book():
    return claims.read_book(NOTEBOOKS)


def test_labels_are_unique(book):
    assert book.duplicates == []


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_summary_bullet_links_to_its_proof(chapter, book):
    assert claims.summary_problems(chapter, book) == []


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
