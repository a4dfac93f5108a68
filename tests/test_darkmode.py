"""The built book in the theme's dark mode: readable text and readable pictures.

The browser reports a dark system setting, as a reader's would, and the theme follows
it (`default_mode: auto`). Each page is screenshotted (_build/screenshots/dark__*.png)
and checked with axe's colour-contrast rule (results in axe-dark.json). Every picture
must stay readable: the book's pictures are drawn dark on white, so in dark mode each
must still show a light ground with ink at least 4.5:1 against it (WCAG's ratio for
text), not dark ink on the dark page or an inverted, dimmed copy. The last tests show
both checks failing on a page deliberately broken in the browser.
"""

import io
import json

import pytest
from axe_playwright_python.sync_playwright import Axe
from PIL import Image

from test_browser import PAGES, SHOTS, PageVisit, browser, site  # noqa: F401 (fixtures)

PICTURES = "article.bd-article img"
# resolves after two animation frames: what was scrolled into view has been painted
FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
OPEN_GOING_DEEPER = "document.querySelectorAll('details.going-deeper').forEach(d => d.open = true)"
MIN_CONTRAST = 4.5  # WCAG 2 AA, normal text
# Only the colour-contrast rule; results other than violations left out (axe would
# otherwise send back every passing text node of the page, which takes a while).
COLOUR_CONTRAST = {
    "runOnly": {"type": "rule", "values": ["color-contrast"]},
    "resultTypes": ["violations"],
}


class DarkBrowser:
    """The test browser, opening every page with a dark system colour scheme."""

    def __init__(self, browser):  # noqa: F811
        self.browser = browser

    def new_page(self, **options):
        return self.browser.new_page(color_scheme="dark", **options)


def luminance(rgb) -> float:
    """WCAG relative luminance of an sRGB colour."""

    def channel(value):
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ground_and_ink(image: Image.Image) -> tuple[float, float]:
    """Luminance of a picture's ground (its commonest colour) and of its darkest ink
    (the darkest colour covering at least 0.05% of it, so that no stray pixel counts)."""
    colours = image.getcolors(maxcolors=image.width * image.height)
    ground = max(colours)[1]
    enough = max(1, image.width * image.height // 2000)
    ink = min(luminance(rgb) for count, rgb in colours if count >= enough)
    return luminance(ground), ink


def too_dark(ground: float, contrast: float) -> bool:
    return ground < 0.5 or contrast < MIN_CONTRAST


def picture_problems(page) -> list[str]:
    """Each picture, screenshotted on its own, checked for a light ground and dark enough
    ink. One screenshot per picture, not crops of a full-page one: Chromium leaves a
    full-page screenshot blank below about 16,000 px, and chapters are taller than that."""
    problems = []
    pictures = page.locator(PICTURES)
    for n in range(pictures.count()):
        picture = pictures.nth(n)
        alt = picture.get_attribute("alt") or ""
        if not picture.is_visible():
            problems.append(f"{alt[:50]!r}: not shown on the page, so not checked")
            continue
        # decoded is not painted: a big picture scrolled into view may be rasterised some
        # frames later, and a screenshot before that shows the dark page behind it; a
        # picture that is really dark stays dark on every try
        picture.evaluate("img => img.decode()")
        for _ in range(4):
            picture.scroll_into_view_if_needed()
            page.evaluate(FRAMES)
            shot = Image.open(io.BytesIO(picture.screenshot())).convert("RGB")
            ground, ink = ground_and_ink(shot)
            contrast = (ground + 0.05) / (ink + 0.05)
            if not too_dark(ground, contrast):
                break
        if too_dark(ground, contrast):
            problems.append(f"{alt[:50]!r}: ground {ground:.2f}, ink contrast {contrast:.1f}:1")
    return problems


def serious_contrast_violations(page, context: str | None = None) -> dict:
    violations = Axe().run(page, context, COLOUR_CONTRAST).response["violations"]
    return {
        v["id"]: [n["target"] for n in v["nodes"]][:5]
        for v in violations
        if v["impact"] in ("serious", "critical")
    }


def pictures_decoded(page):
    # a picture not yet decoded would show the dark page behind it: wait for all of them
    page.wait_for_function("Array.from(document.images).every(img => img.complete)")


def full_page(page, doc: str):
    """The whole page, for a person to look at (the checks screenshot each picture)."""
    pictures_decoded(page)
    page.screenshot(path=dark_shot(doc), full_page=True)


def dark_shot(doc: str):
    return SHOTS / f"dark__{doc.replace('/', '__')}.png"


@pytest.fixture(scope="module")
def dark_visits(browser, site):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    visits = {doc: PageVisit(DarkBrowser(browser), site, doc) for doc in PAGES}
    for doc, visit in visits.items():
        visit.settle()  # console errors are recorded until here: axe's own fetches are not
        # a reader who opens a "Going deeper" box sees its pictures in dark mode too
        visit.page.evaluate(OPEN_GOING_DEEPER)
        full_page(visit.page, doc)
    yield visits
    for visit in visits.values():
        visit.page.close()


@pytest.mark.parametrize("doc", PAGES)
def test_dark_mode_is_readable(dark_visits, doc):
    page = dark_visits[doc].page
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    violations = serious_contrast_violations(page)
    report = SHOTS / "axe-dark.json"
    recorded = json.loads(report.read_text()) if report.exists() else {}
    recorded[doc] = violations
    report.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    assert violations == {}
    assert picture_problems(page) == []
    assert dark_visits[doc].console_errors == []


def test_the_book_has_pictures_to_check(dark_visits):
    counts = {doc: visit.page.locator(PICTURES).count() for doc, visit in dark_visits.items()}
    assert counts["notebooks/01-autograd-graph"] >= 3 and sum(counts.values()) >= 15, counts
    missing = [doc for doc in dark_visits if not dark_shot(doc).is_file()]
    assert missing == [], "pages without a dark screenshot in _build/screenshots/"


def test_dark_mode_checks_catch_dim_pictures_and_faint_text(browser, site):  # noqa: F811
    visit = PageVisit(DarkBrowser(browser), site, "notebooks/01-autograd-graph")
    visit.settle()
    page = visit.page
    # a theme that inverts and dims pictures in dark mode, and greys out paragraphs
    page.add_style_tag(
        content="img { filter: invert(1) brightness(0.4) !important; }"
        " p { color: #3a3a3a !important; }"
    )
    try:
        pictures_decoded(page)
        problems = picture_problems(page)
        assert len(problems) == page.locator(PICTURES).count() > 0, problems
        # the same rule, on the chapter's opening paragraph only (the whole page is slow)
        opening = "article.bd-article > section > p"
        assert "color-contrast" in serious_contrast_violations(page, opening)
    finally:
        page.close()
