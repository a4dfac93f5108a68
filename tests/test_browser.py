"""The built book in a real browser: Debian's Chromium, driven by Playwright.

Every page of _toc.yml is loaded from a local server and watched for a while after
its load event, so that an error logged late (by a timer, a slow script) counts too.
Requests to other hosts (the CDN that serves MathJax and Thebe) get an empty answer,
as there is no network here; they are recorded, never failed. A screenshot of each
page goes to _build/screenshots/ for review, and the accessibility results to
_build/screenshots/axe.json.
"""

import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import links
import pytest
import yaml
from alt_text import alt_problem
from axe_playwright_python.sync_playwright import Axe
from book_pdf import serve  # one local server for the tests and make pdf
from playwright.sync_api import sync_playwright

import nbcheck

ROOT = nbcheck.ROOT
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PAGES = nbcheck.toc_files()
FIRST_CHAPTER = next(doc for doc in PAGES if doc.startswith("notebooks/"))
# Each page is watched this long after its load event. All pages stay open while the
# next ones load, so the watch costs about one such window in all, not one per page.
WATCH_SECONDS = 3.0
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def site(built_book):
    with serve(built_book) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "Chromium is missing: apt-get install chromium"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class PageVisit:
    """One page loaded in a fresh browser page, with everything that went wrong."""

    def __init__(self, browser, site, doc):
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.console_errors, self.local_failures, self.external = [], [], []
        self.watching = True
        note = self._note
        self.page.on("console", lambda m: m.type == "error" and note("console_errors", m.text))
        self.page.on("pageerror", lambda e: note("console_errors", str(e)))
        self.page.on(
            "requestfailed", lambda r: self._local(r.url) and note("local_failures", r.url)
        )
        self.page.on(
            "response",
            lambda r: (
                self._local(r.url)
                and r.status >= 400
                and note("local_failures", f"{r.status} {r.url}")
            ),
        )
        self.page.route("**/*", self._route)
        self.site = site
        self.page.goto(f"{site}/{doc}.html", wait_until="load")
        self.loaded_at = time.monotonic()

    def settle(self):
        """Wait until the network is idle and the page was watched WATCH_SECONDS since load."""
        self.page.wait_for_load_state("networkidle")
        left = WATCH_SECONDS - (time.monotonic() - self.loaded_at)
        self.page.wait_for_timeout(max(left, 0) * 1000)
        # The record closes here: what follows is the tests' own doing (axe-core fetches
        # the stylesheets again and resolves an @import against the site's root).
        self.watching = False

    def _note(self, kind, what):
        if self.watching:
            getattr(self, kind).append(what)

    def _local(self, url):
        return urlparse(url).hostname == "127.0.0.1"

    def _route(self, route):
        url = route.request.url
        if self._local(url) or url.startswith("data:"):
            route.continue_()
        else:
            self._note("external", url)
            route.fulfill(status=200, body="", content_type="text/plain")


def shot_path(doc: str) -> Path:
    return SHOTS / f"{doc.replace('/', '__')}.png"


@pytest.fixture(scope="module")
def visits(browser, site):
    """Every page loaded, settled, screenshot and checked by axe-core (_build/screenshots/)."""
    shutil.rmtree(SHOTS, ignore_errors=True)  # what is there was made by this run
    SHOTS.mkdir(parents=True)
    loaded = {doc: PageVisit(browser, site, doc) for doc in PAGES}
    for doc, visit in loaded.items():
        visit.settle()
        visit.page.screenshot(path=str(shot_path(doc)), full_page=True)
        violations = Axe().run(visit.page).response["violations"]
        visit.axe = {v["id"]: (v["impact"], len(v["nodes"])) for v in violations}
    axe = {doc: visit.axe for doc, visit in loaded.items()}
    (SHOTS / "axe.json").write_text(json.dumps(axe, indent=1, sort_keys=True))
    yield loaded
    for visit in loaded.values():
        visit.page.close()


@pytest.mark.parametrize("doc", PAGES)
def test_page_loads_without_errors(visits, doc):
    visit = visits[doc]
    assert visit.console_errors == []
    assert visit.local_failures == []
    unexpected = {urlparse(u).hostname for u in visit.external} - {"cdn.jsdelivr.net"}
    assert unexpected == set(), "the page reaches hosts other than the MathJax/Thebe CDN"


@pytest.mark.parametrize("doc", PAGES)
def test_images_loaded_with_alt_text(visits, doc):
    images = visits[doc].page.eval_on_selector_all(
        "img",
        "els => els.map(e => ({src: e.getAttribute('src') || '', alt: e.getAttribute('alt'),"
        " width: e.naturalWidth, complete: e.complete}))",
    )
    problems = [
        f"{i['src'][:80]!r}: {alt_problem(i['src'], i['alt']) or 'did not load'}"
        for i in images
        if not (i["complete"] and i["width"] > 0) or alt_problem(i["src"], i["alt"])
    ]
    assert problems == [], "\n".join(problems)


# A figure taller than this cannot be seen whole on a laptop screen, even scrolled to.
TALLEST_FIGURE = 1200  # CSS pixels, at the 1300-pixel-wide window of the visits


def too_tall(page) -> list[str]:
    """Every image in the page's article taller than TALLEST_FIGURE, with its height."""
    return page.eval_on_selector_all(
        "article img",
        f"els => els.filter(e => e.getBoundingClientRect().height > {TALLEST_FIGURE})"
        ".map(e => Math.round(e.getBoundingClientRect().height) + ' px: ' + e.alt.slice(0, 60))",
    )


@pytest.mark.parametrize("doc", PAGES)
def test_no_figure_is_taller_than_a_screen(visits, doc):
    assert too_tall(visits[doc].page) == []


def test_figure_height_check_catches_a_tall_figure(browser):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    tall = "data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg' width='200' height='1500'/>"
    page.set_content(f'<article><img alt="a tall graph" src="{tall}"></article>')
    page.wait_for_function("document.images[0].complete")
    assert too_tall(page) == ["1500 px: a tall graph"]
    page.close()


@pytest.mark.parametrize("doc", PAGES)
def test_errors_shown_only_in_cells_declared_to_fail(visits, doc):
    stray = visits[doc].page.eval_on_selector_all(
        ".cell_output .output.traceback, .cell_output .output.error",
        "els => els.filter(e => !e.closest('.tag_raises-exception')).length",
    )
    assert stray == 0


@pytest.mark.parametrize("doc", PAGES)
def test_no_serious_accessibility_violations(visits, doc):
    serious = {k: v for k, v in visits[doc].axe.items() if v[0] in ("serious", "critical")}
    assert serious == {}


def test_every_page_has_its_screenshot_and_axe_results(visits):
    missing = [doc for doc in PAGES if not shot_path(doc).is_file()]
    assert missing == [], "pages without a screenshot in _build/screenshots/"
    recorded = json.loads((SHOTS / "axe.json").read_text())
    assert sorted(recorded) == sorted(PAGES), "axe.json lacks pages"


def test_solution_opens_on_click(browser, site):
    visit = PageVisit(browser, site, FIRST_CHAPTER)
    solutions = visit.page.locator("div.solution")
    assert solutions.count() >= 3, "the first chapter shows fewer than three solutions"
    bodies = [solutions.nth(i).locator(".admonition-title ~ *").first for i in range(3)]
    assert not any(b.is_visible() for b in bodies), "a solution is visible before any click"
    solutions.first.locator(".admonition-title").click()
    bodies[0].wait_for(state="visible", timeout=5000)
    assert bodies[0].inner_text().strip(), "the opened solution is empty"
    visit.page.close()


def test_launch_buttons_point_where_the_config_says(browser, site):
    config = yaml.safe_load((ROOT / "_config.yml").read_text("utf-8"))
    repo = urlparse(config["repository"]["url"]).path.strip("/")
    branch = config["repository"]["branch"]
    binder = config["launch_buttons"]["binderhub_url"]
    chapter = FIRST_CHAPTER
    visit = PageVisit(browser, site, chapter)
    links = visit.page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    expected_binder = f"{binder}/v2/gh/{repo}/{branch}?urlpath=lab/tree/{chapter}.ipynb"
    binder_links = [link for link in links if link.startswith(binder)]
    assert expected_binder in links, f"Binder links {binder_links}, not {expected_binder}"
    assert visit.page.locator("button.btn-launch-thebe, .launch-thebe").count() >= 1
    assert config["repository"]["url"] in links
    visit.page.close()


def test_download_button_serves_the_chapter_notebook(browser, site):
    visit = PageVisit(browser, site, FIRST_CHAPTER)
    links = visit.page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    download = [link for link in links if link.endswith(f"_sources/{FIRST_CHAPTER}.ipynb")]
    assert download, "no .ipynb download link"
    response = visit.page.request.get(download[0])
    assert response.ok, f"the download link answers {response.status}: {download[0]}"
    assert json.loads(response.body())["cells"]
    visit.page.close()


# Links and anchors are checked from the built files (tests/links.py): every page
# reached from index.html, every address inside the book. Anything outside it (the
# CDN, the repository, papers) is not: there is no network here. (LinkChecker crawled
# the same pages in 150-260 s, most of it parsing anchors; this reads them in 3 s.)


def test_every_internal_link_and_anchor_resolves(built_book):
    broken = links.broken_links(built_book)
    # every broken address in the message: the break probe looks for its own among them
    assert broken == [], "broken links:\n" + "\n".join(broken)
    assert links.count_links(built_book) > 1000, "too few links checked to have seen the book"


def test_link_check_catches_a_broken_link_and_a_broken_anchor(tmp_path):
    redirect = '<meta http-equiv="Refresh" content="0; url=a/start.html">'
    (tmp_path / "index.html").write_text(redirect)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "start.html").write_text(
        '<html><body><a href="other.html#missing">bad anchor</a>'
        '<a href="nowhere.html">bad page</a><a href="other.html#here">good</a>'
        '<a href="#top" id="top">self</a><img src="../pic.svg" alt="gone">'
        '<a href="https://example.org/x.html#y">outside</a></body></html>'
    )
    (tmp_path / "a" / "other.html").write_text('<html><body><h1 id="here">x</h1></body></html>')
    assert links.broken_links(tmp_path) == [
        "a/start.html: other.html#missing: no anchor #missing on a/other.html",
        "a/start.html: nowhere.html: no such file",
        "a/start.html: ../pic.svg: no such file",
    ]
    assert links.count_links(tmp_path) == 6  # the redirect, four links, the image
    with pytest.raises(FileNotFoundError, match="no index.html"):
        links.broken_links(tmp_path / "a")
