"""The appendices: the error index covers every declared error; the glossary is used."""

import re
import sys

import nbformat
from test_notebooks import build_run

import claims
import nbcheck

ROOT = nbcheck.ROOT
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import error_index  # noqa: E402


def declared_messages():
    for path in nbcheck.toc_notebooks():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if "expected_error" in cell.metadata:
                yield path.name, cell.metadata["expected_error"]


def raised_in_the_build(built_book):
    """Each error the book build's own run of the chapters raised, as 'Type: message'."""
    for path in nbcheck.toc_notebooks():
        try:
            executed = build_run(built_book, path)
        except KeyError:  # not executed by the build: it raised nothing
            continue
        for cell in executed.cells:
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    yield f"{output.ename}: {output.evalue}"


def build_run_if_any(built_book, path):
    """The build's run of a page, or None for one the build did not execute (as
    raised_in_the_build: the page's source is still read for what it catches)."""
    try:
        return build_run(built_book, path)
    except KeyError:
        return None


def caught_in_the_build(built_book):
    """Each whole message a page catches and prints or checks word for word, as
    'Type: message' (book/_ext/error_index.py; the page's own check holds it exact)."""
    cells = error_index.book_claims(
        nbcheck.toc_notebooks(), lambda path: build_run_if_any(built_book, path)
    )
    for cell in cells:
        for claim in cell.claims:
            if claim.how != "declared" and claim.exact and claim.type:
                yield f"{claim.type}: {claim.text}"


def test_error_index_shows_the_errors_the_chapters_raise(built_book):
    # The index is made from the declarations; check it against what the executed
    # chapters really raised, so that a wrong declared message cannot reach the page.
    page = nbcheck.built_page(built_book, "book/errors")
    shown = {pre.get_text().strip() for pre in page.select("pre.error-message")}
    raised = {message.strip() for message in raised_in_the_build(built_book)}
    caught = set(caught_in_the_build(built_book))
    assert raised, "the build's run of the chapters raised no error at all"
    assert sorted(shown - raised - caught) == [], "the index shows messages no page raises"
    assert sorted(raised - shown) == [], "errors the chapters raise that the index lacks"
    assert list(declared_messages()), "no chapter declares an expected error"


def test_every_explanation_is_used(built_book):
    # An entry no page shows any more is stale advice. "Shows": declares, prints or
    # checks the error (book/_ext/error_index.py), read with the build's own outputs.
    explanations = error_index.load_explanations()
    cells = error_index.book_claims(
        nbcheck.toc_notebooks(), lambda path: build_run(built_book, path)
    )
    shown = error_index.resolve(cells, explanations).shown
    unused = [key for key in explanations if not shown.get(key)]
    assert unused == []


def test_error_index_links_to_sections_that_exist(built_book):
    page = nbcheck.built_page(built_book, "book/errors")
    links = [a["href"] for a in page.select("article dd a[href*='#']")]
    assert links
    by_page: dict[str, list[str]] = {}
    for href in links:
        target, anchor = href.split("#")
        by_page.setdefault(target, []).append(anchor)
    for target, anchors in by_page.items():  # each page parsed once, not once per link
        ids = {tag["id"] for tag in nbcheck.html(built_book / "book" / target).select("[id]")}
        missing = [f"{target}#{anchor}" for anchor in anchors if anchor not in ids]
        assert missing == [], missing


def test_chapters_link_glossary_terms(built_book):
    glossary = nbcheck.built_page(built_book, "book/glossary")
    terms = {dt.get("id") for dt in glossary.select("dl.glossary dt")}
    used = set()
    for path in nbcheck.toc_notebooks():
        soup = nbcheck.built_page(built_book, path)
        used |= {a["href"].split("#")[1] for a in soup.select("a[href*='glossary.html#']")}
    assert used and used <= terms
    assert len(used) >= 8, f"only {len(used)} glossary terms are linked from the chapters"


def test_every_chapter_page_is_stamped_with_the_torch_that_ran_it(built_book):
    import torch

    version = torch.__version__.split("+")[0]
    for path in nbcheck.toc_notebooks():
        stamp = nbcheck.built_page(built_book, path).select_one("p.verified-stamp")
        assert stamp is not None, path.name
        assert re.search(rf"torch {re.escape(version)} .* on \d{{4}}-\d{{2}}-\d{{2}}\.", stamp.text)


def test_references_are_cited(built_book):
    refs = nbcheck.built_page(built_book, "book/references")
    entries = refs.select("div.citation, dl.citation > dt, .citation")
    assert len(entries) >= 9
    simsiam = nbcheck.built_page(built_book, "notebooks/06-simsiam")
    assert simsiam.select("a[href*='references.html#']"), "chapter 6 cites nothing"


def test_chapters_link_the_appendices(built_book):
    for path in nbcheck.toc_notebooks():
        if path.parent.name != "notebooks":
            continue
        soup = nbcheck.built_page(built_book, path)
        hrefs = {a["href"].split("#")[0] for a in soup.select("article a[href]")}
        assert "../book/errors.html" in hrefs and "../book/glossary.html" in hrefs, path.name


def test_the_cheat_sheet_s_lines_are_its_table_rows(tmp_path):
    md = nbformat.v4.new_markdown_cell
    nb = nbformat.v4.new_notebook(
        cells=[
            md("# Cheat sheet\n\nAn introduction.\n\n| Tool | Does |\n|---|:--:|\n"
               "| `a` | one {ref}`x` |\n| `b` | two |\n\nAfter the table."),
            md("## Checks\n\nNot a line: the sheet has a table.\n\n| Not | a |\n| table |"),
        ]
    )  # fmt: skip
    path = tmp_path / "sheet.ipynb"
    nbformat.write(nb, path)
    assert claims.cheatsheet_lines(path) == ["| `a` | one {ref}`x` |", "| `b` | two |"]
    problems = claims.cheatsheet_problems(path, claims.read_book([path]))
    assert problems == [
        "sheet.ipynb, line 1: link to 'x', which labels no section",
        "sheet.ipynb, line 2: no {ref} link to a proving section: '| `b` | two |'",
    ]
