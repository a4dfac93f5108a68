"""The built site with the network down: its math comes from the site itself.

Every request to another host is aborted, as a browser with no network (or behind a
firewall, or reading a saved copy) would see it. A page that still needed a CDN shows
raw TeX where its formulas should be, or logs the failed request as a console error;
either fails. The last test shows that the check does catch a page whose MathJax
comes from a CDN.
"""

import re
import shutil
from urllib.parse import urlparse

import pytest

import nbcheck
from test_browser import PAGES, PageVisit, browser, serve, site  # noqa: F401 (fixtures)

# How Sphinx marks inline and display math in a page; MathJax puts its output inside.
MATH = "span.math, div.math"
# TeX delimiters that must not survive typesetting; code blocks may show them freely.
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")
CDN_MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"

TYPESET = """async () => {
  if (!window.MathJax?.startup?.promise) return false;
  await window.MathJax.startup.promise;
  return true;
}"""
UNTYPESET = """sel => Array.from(document.querySelectorAll(sel))
  .filter(e => !e.querySelector('mjx-container'))
  .map(e => e.textContent.trim().slice(0, 60))"""
# Text of the page outside code, scripts and MathJax's own output.
PROSE_TEXT = """() => {
  const skip = 'pre, code, script, style, mjx-container, mjx-assistive-mml';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const parts = [];
  while (walker.nextNode()) {
    if (!walker.currentNode.parentElement.closest(skip)) parts.push(walker.currentNode.data);
  }
  return parts.join(' ');
}"""


class OfflineVisit(PageVisit):
    """A page loaded with every request to another host aborted: no network at all."""

    def _route(self, route):
        url = route.request.url
        if self._local(url) or url.startswith("data:"):
            route.continue_()
        else:
            self.external.append(url)
            route.abort("internetdisconnected")


def offline_problems(visit: PageVisit) -> list[str]:
    """Everything that shows the page needs the network or left its math untypeset."""
    page = visit.page
    problems = [f"asked another host for {url}" for url in visit.external]
    math_count = page.locator(MATH).count()
    if math_count:
        if not page.evaluate(TYPESET):
            problems.append(f"{math_count} formulas but MathJax never started")
        problems += [f"not typeset: {tex!r}" for tex in page.evaluate(UNTYPESET, MATH)]
    raw = RAW_TEX.findall(page.evaluate(PROSE_TEXT))
    if raw:
        problems.append(f"raw TeX left in the text: {sorted(set(raw))}")
    problems += [f"console error: {e}" for e in visit.console_errors + visit.local_failures]
    return problems


def pages_with_math(html_root) -> list[str]:
    return [doc for doc in PAGES if nbcheck.built_page(html_root, doc).select(MATH)]


def test_the_book_has_math_for_the_offline_check(built_book):
    with_math = pages_with_math(built_book)
    assert "notebooks/01-autograd-graph" in with_math and len(with_math) >= 4, with_math


def test_mathjax_is_served_by_the_site(built_book):
    for doc in pages_with_math(built_book):
        sources = [s.get("src", "") for s in nbcheck.built_page(built_book, doc).select("script")]
        mathjax = [src for src in sources if "mathjax" in src.lower()]
        assert mathjax and all(not src.startswith(("http:", "https:", "//")) for src in mathjax)
        # the build appends a cache-busting query (?v=...): the file is the path before it
        files = [(built_book / doc).parent / urlparse(src).path for src in mathjax]
        assert all(file.is_file() for file in files), doc


@pytest.fixture(scope="module")
def offline_visits(browser, site):  # noqa: F811
    """Every page loaded with the network down, then watched a while (settle)."""
    visits = {doc: OfflineVisit(browser, site, doc) for doc in PAGES}
    for visit in visits.values():
        visit.settle()
    yield visits
    for visit in visits.values():
        visit.page.close()


@pytest.mark.parametrize("doc", PAGES)
def test_page_works_with_the_network_down(offline_visits, doc):
    assert offline_problems(offline_visits[doc]) == []


def test_offline_check_catches_mathjax_from_a_cdn(browser, built_book, tmp_path):  # noqa: F811
    copy = tmp_path / "html"
    shutil.copytree(built_book, copy)
    doc = "notebooks/01-autograd-graph"
    page = copy / f"{doc}.html"
    local = next(s["src"] for s in nbcheck.built_page(copy, doc).select("script[src*=mathjax]"))
    page.write_text(page.read_text("utf-8").replace(f'src="{local}"', f'src="{CDN_MATHJAX}"'))
    with serve(copy) as url:
        visit = OfflineVisit(browser, url, doc)
        visit.settle()
        problems = offline_problems(visit)
        visit.page.close()
    assert f"asked another host for {CDN_MATHJAX}" in problems
    assert any(p.startswith("raw TeX left in the text") for p in problems), problems
    assert any(p.startswith("console error") for p in problems), problems
