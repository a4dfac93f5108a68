"""Every picture's labels are readable at the page's width: at least 10 px as drawn.

Each page of the book is loaded in Chromium at the window width of the browser tests,
and the text of each of its pictures measured where it lands (tests/picture_labels.py):
a graph squeezed into half the column, side by side with another, shrinks its labels
with it. The measure is checked on hand-made pictures first, the squeezed graph
included.
"""

from __future__ import annotations

import base64
from urllib.parse import urlparse

import picture_labels
import pytest

import nbcheck
from test_browser import CHROMIUM, CHROMIUM_ARGS, serve

PAGES = nbcheck.toc_files()
VIEWPORT = {"width": 1300, "height": 1000}  # as tests/test_browser.py's visits
# Pages whose pictures are still drawn too small (window 1300 px, column 680 px), each
# with what is too small: expected to fail, visibly (pytest reports them as xfail, and
# as a failure once they pass, so that a page leaves this dict in the commit that makes
# its pictures readable). None since 2026-12-02.
NOT_YET: dict[str, str] = {}


def page_param(doc):
    if doc in NOT_YET:
        return pytest.param(doc, marks=pytest.mark.xfail(reason=NOT_YET[doc], strict=True))
    return doc


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def offline(route):
    """Only the local site answers; nothing may reach the network."""
    if urlparse(route.request.url).hostname == "127.0.0.1" or route.request.url.startswith("data:"):
        route.continue_()
    else:
        route.abort("internetdisconnected")


@pytest.fixture(scope="module")
def measured(built_book, browser):
    """Each page's pictures that have labels under 10 px, one line each."""
    found = {}
    with serve(built_book) as site:
        page = browser.new_page(viewport=VIEWPORT)
        page.route("**/*", offline)
        for doc in PAGES:
            page.goto(f"{site}/{doc}.html", wait_until="load")
            page.wait_for_function("Array.from(document.images).every(i => i.complete)")
            found[doc] = picture_labels.small_labels(page)
        page.close()
    return found


@pytest.mark.parametrize("doc", [page_param(doc) for doc in PAGES])
def test_picture_labels_are_at_least_10_px(measured, doc):
    assert measured[doc] == [], "\n".join(measured[doc])


def test_not_yet_lists_only_pages_of_the_book():
    assert set(NOT_YET) <= set(PAGES), set(NOT_YET) - set(PAGES)


# --- the measure itself, on hand-made pictures ----------------------------------------

# The shape of Graphviz's output: sizes in points, a viewBox in points, 14-point labels.
GRAPH = """<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" height="60pt"
 viewBox="0.00 0.00 {w}.00 60.00"><g transform="scale(1 1) rotate(0) translate(4 56)">
<polygon fill="white" points="-4,4 -4,-56 {w},-56 {w},4 -4,4"/>
<text x="20" y="-20" font-family="monospace" font-size="14.00">AddBackward0</text>
<text x="200" y="-20" font-family="monospace" font-size="14.00">SumBackward0</text>
</g></svg>"""
# The shape of matplotlib's: text as glyphs scaled to the font size (10 pt: 0.1).
PLOT = """<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
 width="300pt" height="100pt" viewBox="0 0 300 100"><rect width="300" height="100"
 fill="white"/><defs><path id="g" d="M 0 0 L 60 70 L 0 70 z"/></defs>
<g id="text_1"><!-- loss --><g transform="translate(20 50) scale(0.1 -0.1)">
<use xlink:href="#g"/></g></g></svg>"""


def img(svg: str, style: str = "") -> str:
    data = base64.b64encode(svg.encode()).decode()
    return f'<img alt="a probe" style="{style}" src="data:image/svg+xml;base64,{data}">'


def measure(browser, body: str):
    page = browser.new_page(viewport=VIEWPORT)
    page.set_content(f"<article>{body}</article>")
    page.wait_for_function("Array.from(document.images).every(i => i.complete)")
    try:
        return picture_labels.label_sizes(page), picture_labels.small_labels(page)
    finally:
        page.close()


def test_a_graph_at_its_own_size_keeps_its_labels(browser):
    (graph,), problems = measure(browser, img(GRAPH.format(w=300)))
    sizes = [round(size, 1) for _, size in graph["labels"]]
    assert sizes == [18.7, 18.7] and problems == []  # 14 pt = 18.7 px


def test_a_graph_squeezed_into_a_narrow_panel_is_caught(browser):
    # 900 pt (1200 px) wide, drawn 300 px wide: labels at a quarter of 18.7 px.
    (graph,), problems = measure(browser, img(GRAPH.format(w=900), "width:300px"))
    assert [round(size, 2) for _, size in graph["labels"]] == [4.67, 4.67]
    assert problems == [
        "'a probe': 2 of 2 labels under 10 px (smallest 4.7 px, 'AddBackward0'); "
        "drawn 300 px wide of its 1200 px"
    ]


def test_a_padded_image_is_measured_inside_its_padding(browser):
    # The theme's border-box: 408 px wide with 4 px of padding leaves 400 px of picture.
    style = "box-sizing:border-box;width:408px;padding:4px"
    (graph,), _ = measure(browser, img(GRAPH.format(w=300), style))
    assert [round(size, 1) for _, size in graph["labels"]] == [18.7, 18.7]


def test_a_plot_s_glyph_text_and_a_folded_picture_are_measured(browser):
    body = f"<details><summary>open</summary>{img(PLOT, 'width:200px')}</details>"
    (plot,), problems = measure(browser, body)
    # 10 pt in a 300 pt (400 px) plot drawn 200 px wide: 13.3 px / 2
    assert [(text, round(size, 2)) for text, size in plot["labels"]] == [("loss", 6.67)]
    assert len(problems) == 1 and "'loss'" in problems[0]


def test_an_inline_svg_is_measured(browser):
    (inline,), _ = measure(browser, GRAPH.format(w=300).replace("<svg", '<svg aria-label="x"'))
    assert [round(size, 1) for _, size in inline["labels"]] == [18.7, 18.7]
