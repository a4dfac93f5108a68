"""The error index is complete: every error a page raises on purpose has its entry.

An error is raised on purpose when a cell declares it, prints it as a traceback's last
line does (``RuntimeError: ...``), or catches it and compares its message with a
string; book/_ext/error_index.py says how each is found, and the index is built from
the same reading of the pages. Here every page of the book is read with the outputs
of the build's own run, and the test fails on such an error that no entry of
book/error-explanations.yml covers, and on an entry whose "Shown in" leaves out a
section that shows its error. Section titles must be unique within a page, or a link
to the second of two equal titles would land on the first.
"""

from __future__ import annotations

import posixpath
import sys
from collections import Counter

import nbformat
import pytest
from test_notebooks import build_run

import nbcheck

sys.path.insert(0, str(nbcheck.ROOT / "book" / "_ext"))
import error_index as ei  # noqa: E402

EXPLANATIONS = nbcheck.ROOT / "book" / "error-explanations.yml"


def executed_by_the_build(built_book):
    def executed(path):
        try:
            return build_run(built_book, path)
        except KeyError:  # not executed by the build (it has no code to run)
            return None

    return executed


@pytest.fixture(scope="module")
def book_errors(built_book):
    cells = ei.book_claims(nbcheck.toc_notebooks(), executed_by_the_build(built_book))
    return cells, ei.resolve(cells, ei.load_explanations(EXPLANATIONS))


def describe(cell, claim) -> str:
    what = {
        "declared": "declares",
        "printed": "prints",
        "checked": "checks a caught error against",
    }[claim.how]
    kind = f"{claim.type} " if claim.type else ""
    return f"{cell.where()} {what} {kind}{claim.text[:90]!r}"


def test_every_error_a_page_shows_is_indexed(book_errors):
    cells, resolved = book_errors
    assert any(c.how == "checked" for cell in cells for c in cell.claims)
    assert any(c.how == "declared" for cell in cells for c in cell.claims)
    missing = [describe(cell, claim) for cell, claim in resolved.unindexed]
    assert missing == [], (
        "errors the pages raise on purpose that no entry of book/error-explanations.yml "
        "covers (add an entry keyed by the start of the message):\n" + "\n".join(missing)
    )


def entry_links(built_book) -> dict[str, set[str]]:
    """Each entry of the built index (by its section id): the hrefs of its "Shown in"."""
    page = nbcheck.built_page(built_book, "book/errors")
    links = {}
    for section in page.select("section[id^='error-']"):
        if section.find("section"):  # the page's own section, around the entries
            continue
        terms = [dt for dt in section.select("dt") if dt.get_text(strip=True) == "Shown in"]
        assert len(terms) == 1, section["id"]
        links[section["id"]] = {a["href"] for a in terms[0].find_next_sibling("dd").select("a")}
    return links


def expected_href(cell) -> str:
    doc = cell.path.relative_to(nbcheck.ROOT).with_suffix(".html").as_posix()
    return f"{posixpath.relpath(doc, 'book')}#{ei.section_anchor(cell.section)}"


def test_shown_in_links_every_section_that_shows_it(built_book, book_errors):
    _, resolved = book_errors
    links = entry_links(built_book)
    assert resolved.shown and links
    missing = []
    for key, shown in resolved.shown.items():
        entry = ei.section_anchor("error " + key)
        for cell, claim in shown:
            if expected_href(cell) not in links.get(entry, set()):
                missing.append(f"{key[:50]!r}: {describe(cell, claim)}")
    assert sorted(set(missing)) == []


def test_shown_in_link_texts_are_plain_words(built_book):
    # A section title is shown as the reader sees it: no Markdown marks, no “"doubled"”.
    page = nbcheck.built_page(built_book, "book/errors")
    texts = [a.get_text() for dd in page.select("dd") for a in dd.select("a")]
    assert any("‘My hook does nothing’" in text for text in texts), "the checklist's link"
    marked = [t for t in texts if "*" in t or "`" in t or '“"' in t or '"”' in t]
    assert marked == []


def test_shown_title_drops_marks_and_nests_quotes():
    assert ei.shown_title("Where *not* to stop: the `grad` **penalty**") == (
        "Where not to stop: the grad penalty"
    )
    assert ei.shown_title('"My hook does nothing": a checklist') == (
        "‘My hook does nothing’: a checklist"
    )
    assert ei.shown_title("x * 3 and 2 * y") == "x * 3 and 2 * y"  # a product is kept


def page_titles(soup) -> list[str]:
    article = soup.select_one("article.bd-article")
    titles = []
    for heading in article.select("section > h1, section > h2, section > h3, section > h4"):
        for link in heading.select("a.headerlink"):
            link.decompose()
        titles.append(heading.get_text(" ", strip=True))
    return titles


# Pages that repeat a title today, each with the reason and who is fixing it. They are
# left out of the check below (and printed); a page leaves this dict in the commit that
# renames its sections.
KNOWN_REPEATS = {
    # Chapter 8 titles three sections "Without the detach"; the Part V rewrite (issue 27,
    # notebooks 08-11) gives each its own title.
    "notebooks/08-who-trains": {"Without the detach"},
}


def test_section_titles_are_unique_within_each_page(built_book):
    repeated = {}
    for doc in nbcheck.toc_files():
        counts = Counter(page_titles(nbcheck.built_page(built_book, doc)))
        twice = {title: n for title, n in counts.items() if n > 1}
        known = {t: n for t, n in twice.items() if t in KNOWN_REPEATS.get(doc, set())}
        if known:
            print(f"{doc} still repeats {known} (KNOWN_REPEATS: not enforced yet)")
        twice = {t: n for t, n in twice.items() if t not in known}
        if twice:
            repeated[doc] = twice
    assert repeated == {}, f"section titles used more than once on a page: {repeated}"


# --- the reading of the pages, on small hand-made notebooks ---------------------------

KEYS = {
    "grad can be implicitly created only for scalar outputs": {},
    "element … of tensors does not require grad and does not have a grad_fn": {},
    "one of the variables needed for gradient computation has been modified by an "
    "inplace operation": {},
}


def notebook(tmp_path, cells, outputs=None):
    """A notebook of (kind, source) cells, and the same with outputs {index: [lines]}."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(
        cells=[md(source) if kind == "md" else code(source) for kind, source in cells]
    )
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    ran = nbformat.from_dict(nb)
    for index, lines in (outputs or {}).items():
        text = "".join(line + "\n" for line in lines)
        ran.cells[index].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    return path, ran


def claims_of(source: str) -> list[tuple[str, bool]]:
    return [(c.text, c.exact) for c in ei.checked_claims(source)]


def test_each_way_of_checking_a_caught_message_is_read():
    source = """
try:
    f()
except RuntimeError as err:
    assert str(err) == "a whole message, word for word"
    assert str(err).startswith("the start of one")
    assert "a piece inside it" in str(err)
    assert str(err).lower().startswith("folded to lower case")
    assert "Tanh" in str(err)                      # too short to name a message
try:
    g()
except ValueError as error:
    message = str(error)
print(message)
assert message.startswith("checked after the handler")
gp.assert_raises(lambda: h(), "through the book's helper")
gp.show_error(lambda: h(), "shown by it", error=TypeError)
"""
    assert claims_of(source) == [
        ("through the book's helper", False),
        ("shown by it", False),
        ("a whole message, word for word", True),
        ("the start of one", False),
        ("a piece inside it", False),
        ("folded to lower case", False),
        ("checked after the handler", False),
    ]
    types = {c.text: c.type for c in ei.checked_claims(source)}
    assert types["shown by it"] == "TypeError" and types["the start of one"] == "RuntimeError"
    assert [c.folded for c in ei.checked_claims(source)][5] is True


def test_a_handler_that_does_not_read_the_message_names_nothing():
    source = """
for name in names:
    try:
        result = getattr(torch, name)(t)
    except Exception:
        continue
try:
    y.backward()
except RuntimeError as err:
    outcome = "error"
%timeit x
"""
    assert claims_of(source) == []


def test_keys_with_a_word_that_varies():
    key = "element … of tensors does not require grad and does not have a grad_fn"
    assert ei.key_matches_message(key, key.replace("…", "1"))
    assert not ei.key_matches_message(key, key.replace("…", "1 2"))
    assert ei.key_matches_fragment(key, "element 12 of tensors does not")
    assert ei.key_matches_fragment(key, "does not require grad and")
    assert not ei.key_matches_fragment(key, "element 1 of vectors")
    assert ei.entry_for_fragment("is not implemented", ["derivative for … is not implemented"])


def test_unindexed_errors_are_reported_and_indexed_ones_are_not(tmp_path):
    path, ran = notebook(
        tmp_path,
        [
            ("md", "# 1. Probe\n\n## Indexed"),
            (
                "code",
                "try:\n    f()\nexcept RuntimeError as err:\n"
                "    assert str(err).startswith('grad can be implicitly created')",
            ),
            (
                "code",
                "try:\n    f()\nexcept RuntimeError as err:\n"
                "    assert str(err).startswith('element 3 of tensors does not')",
            ),
            ("md", "## Not indexed\n\n```python\n# not a heading\n```"),
            (
                "code",
                "try:\n    f()\nexcept RuntimeError as err:\n"
                "    assert str(err) == 'shape is invalid for input of size 2'",
            ),
            ("code", "print(f'{type(err).__name__}: {err}')"),
            ("md", "## A detail of an indexed message"),
            (
                "code",
                "try:\n    f()\nexcept RuntimeError as err:\n"
                "    print(str(err)[:40])\n"
                "    assert 'which is output 0 of Tanh' in str(err)",
            ),
        ],
        outputs={
            5: ["ValueError: not in the index", "UserWarning: a warning, not an error"],
            7: ["one of the variables needed for gradient computation has been"],
        },
    )
    cells = ei.page_cells(path, ran)
    resolved = ei.resolve(cells, KEYS)
    found = [(c.index, c.section, claim.how, claim.text) for c, claim in resolved.unindexed]
    assert found == [
        (4, "Not indexed", "checked", "shape is invalid for input of size 2"),
        (5, "Not indexed", "printed", "not in the index"),
    ]
    shown = {key: {(cell.index, claim.how) for cell, claim in places}
             for key, places in resolved.shown.items()}  # fmt: skip
    assert shown == {
        "grad can be implicitly created only for scalar outputs": {(1, "checked")},
        "element … of tensors does not require grad and does not have a grad_fn": {(2, "checked")},
        "one of the variables needed for gradient computation has been modified by an "
        "inplace operation": {(7, "named in an output")},
    }


def test_the_index_shows_whole_messages_and_links_each_section(tmp_path):
    path, ran = notebook(
        tmp_path,
        [
            ("md", "# 1. Probe\n\n## First"),
            ("code", "try:\n    f()\nexcept RuntimeError as err:\n"
                     "    assert str(err) == 'element 1 of tensors does not require grad and "
                     "does not have a grad_fn'"),
            ("md", "## Second"),
            ("code", "gp.show_error(f, 'element 0 of tensors')"),
        ],
        outputs={3: ["RuntimeError: element 0 of tensors does not require grad and does "
                     "not have a grad_fn"]},
    )  # fmt: skip
    entries = ei.index_entries([path], KEYS, lambda p: ran, lambda p: "notebooks/probe")
    (entry,) = entries.values()
    assert entry["shown"] == [
        ("notebooks/probe", "1. Probe", "First"),
        ("notebooks/probe", "1. Probe", "Second"),
    ]
    assert [m for _, m in entry["messages"]] == [
        "element 1 of tensors does not require grad and does not have a grad_fn",
        "element 0 of tensors does not require grad and does not have a grad_fn",
    ]
