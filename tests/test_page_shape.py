"""Every chapter's reader's path: the short answer first, checks folded, ≤ 15 minutes.

The figures come from the built pages (scripts/page_shape.py): visible prose words,
visible code cells and their lines, asserts left on the path, printed lines wider than
the code column, outputs with no sentence beside them, the short answer's size. The
table of every page is printed; a chapter fails on any figure over its budget.
"""

import pytest
from bs4 import BeautifulSoup

import nbcheck
import page_shape

# Chapters whose issue has not yet put them on the reader's path: their figures are
# printed, not enforced. Each chapter leaves this list in the commit that reshapes it.
NOT_YET: set[str] = set()
# Appendices that carry code, still to be reshaped (issue 27).
APPENDICES_NOT_YET: set[str] = set()

CHAPTERS = [doc for doc in nbcheck.toc_files() if doc.startswith("notebooks/")]
APPENDICES = [doc for doc in nbcheck.toc_files() if not doc.startswith("notebooks/")]


@pytest.fixture(scope="module")
def shapes(built_book):
    found = {s.page: s for s in page_shape.measure_site(built_book)}
    print("\n" + page_shape.table(list(found.values())))
    return found


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_reads_in_fifteen_minutes(shapes, doc):
    problems = page_shape.chapter_problems(shapes[doc])
    if doc in NOT_YET:
        print(f"{doc} (not enforced yet): {problems}")
        return
    assert problems == [], f"{doc}: " + "; ".join(problems)


@pytest.mark.parametrize("doc", APPENDICES)
def test_appendix_keeps_its_checks_folded(shapes, doc):
    problems = page_shape.page_problems(shapes[doc])
    if doc in APPENDICES_NOT_YET:
        print(f"{doc} (not enforced yet): {problems}")
        return
    assert problems == [], f"{doc}: " + "; ".join(problems)


def test_not_yet_lists_only_pages_of_the_book():
    # A name left here after its page was renamed would silently enforce nothing.
    assert NOT_YET <= set(CHAPTERS) and APPENDICES_NOT_YET <= set(APPENDICES)


# --- the measure itself, on small hand-made pages ----------------------------------


def page(body: str) -> BeautifulSoup:
    return BeautifulSoup(
        f'<article class="bd-article"><section id="t"><h1>T</h1>{body}</section></article>',
        "html.parser",
    )


def cell(code: str, output: str | None = None, check: bool = False) -> str:
    source = f'<div class="cell_input"><pre>{code}</pre></div>'
    if check:
        source = f"<details><summary>✓ checked</summary>{source}</details>"
    shown = f'<div class="cell_output"><div class="output stream"><pre>{output}</pre></div></div>'
    tag = " tag_check" if check else ""
    return f'<div class="cell{tag}">{source}{shown if output is not None else ""}</div>'


SHORT = '<section id="s"><h2>The short answer</h2><p>Rule.</p>' + cell("x = 1", "1") + "</section>"


def test_a_clean_page_fits():
    shape = page_shape.measure(page(SHORT + "<p>More.</p>" + cell("assert x", check=True)))
    assert page_shape.chapter_problems(shape) == []
    # T, The short answer, Rule, More: headings are read too
    assert (shape.cells, shape.visible_asserts, shape.words) == (1, 0, 6)


def test_a_visible_assert_a_wide_line_and_a_silent_output_are_caught():
    body = SHORT + "<h2>Next</h2>" + cell("assert x == 1") + cell("print(t)", "t" * 81)
    body += cell("print(u)", "u") + "<p>Notice u.</p>"
    problems = "; ".join(page_shape.chapter_problems(page_shape.measure(page(body))))
    assert "1 visible assert(s)" in problems
    assert "1 printed line(s) wider than 80 characters (widest 81)" in problems
    assert "1 output(s) on the path with no sentence beside them" in problems


def test_a_posts_own_printed_lines_may_keep_their_width():
    wide = "w" * 85
    tagged = cell("print(post_line)", wide).replace('class="cell"', 'class="cell tag_post-output"')
    shape = page_shape.measure(page(SHORT + tagged + "<p>The post's line.</p>"))
    assert shape.wide_lines == 0
    shape = page_shape.measure(page(SHORT + cell("print(line)", wide) + "<p>A line.</p>"))
    assert shape.wide_lines == 1


def test_a_figure_caption_wraps_and_is_not_a_wide_line():
    figure = '<div class="cell_output"><div class="output text_html"><figure><img alt="a">'
    figure += f"<figcaption>{'c' * 200}</figcaption></figure></div></div>"
    body = SHORT + '<div class="cell"><div class="cell_input"><pre>draw()</pre></div>'
    body += figure + "</div>"
    shape = page_shape.measure(page(body))
    assert shape.wide_lines == 0 and shape.unnoticed == 0


def test_a_folded_check_does_not_separate_an_output_from_its_sentence():
    body = SHORT + cell("y = 2", "2") + cell("assert y == 2", check=True) + "<p>Notice.</p>"
    assert page_shape.measure(page(body)).unnoticed == 0


def test_a_chapter_must_open_with_the_short_answer():
    shape = page_shape.measure(page('<section id="o"><h2>Overview</h2><p>Hi.</p></section>'))
    problems = page_shape.chapter_problems(shape)
    assert "its first section is 'Overview', not 'The short answer'" in problems
    assert "the short answer has no runnable example (a visible code cell)" in problems


def test_long_cells_and_a_long_short_answer_are_caught():
    long_answer = "<p>" + "word " * 131 + "</p>"
    body = f'<section id="s"><h2>The short answer</h2>{long_answer}'
    body += cell("\n".join(f"x{i} = {i}" for i in range(15)), "x") + "</section>"
    problems = "; ".join(page_shape.chapter_problems(page_shape.measure(page(body))))
    assert "the short answer has 131 words (at most 130)" in problems
    assert "a visible cell of 15 lines (at most 14)" in problems
    assert "only 0% of the visible cells have at most 8 lines" in problems


def test_words_and_cells_each_in_budget_can_still_take_too_long():
    prose = "<p>" + "word " * 1900 + "</p>"
    cells = "".join(cell(f"x{i} = {i}", str(i)) + f"<p>Notice {i}.</p>" for i in range(25))
    shape = page_shape.measure(page(SHORT + prose + cells))
    problems = "; ".join(page_shape.chapter_problems(shape))
    assert shape.words <= 2000 and shape.cells <= 30
    assert f"{shape.minutes} minutes to read the main path (at most 15)" in problems
    assert shape.minutes > 15


def test_a_check_that_prints_and_an_error_line_are_told_apart():
    error = '<div class="cell_output"><div class="output traceback"><pre>' + "e" * 200
    body = SHORT + cell("assert y", "printed", check=True)
    body += '<div class="cell"><div class="cell_input"><pre>1/0</pre></div>'
    body += f"{error}</pre></div></div></div>"
    shape = page_shape.measure(page(body + "<p>An error.</p>"))
    assert shape.checks_with_output == 1 and shape.wide_lines == 0


def test_a_figure_caption_is_not_a_printed_line():
    caption = "c" * 120
    figure = '<div class="cell_output"><div class="output text_html"><figure><img alt="a">'
    figure += f"<figcaption>{caption}</figcaption></figure></div></div>"
    body = SHORT + f'<div class="cell"><div class="cell_input"><pre>pic</pre></div>{figure}</div>'
    shape = page_shape.measure(page(body))
    assert shape.wide_lines == 0 and shape.unnoticed == 0
    assert page_shape.measure(page(SHORT + cell("print(t)", "t" * 120))).wide_lines == 1
