"""`make pdf`: print the whole book to one PDF with the Chromium the tests drive.

Reads the single-page build (`jupyter-book build --builder singlehtml`, in
_build/singlehtml), serves it on localhost, lets MathJax typeset it, and prints it with
Playwright's page.pdf: A4, page numbers in the footer, a document outline (bookmarks),
every chapter on a new page, solutions opened, folded code left out, long lines
wrapped instead of cut. A table of contents with page numbers goes first: the book is
printed twice, the second time with the page numbers the first print's outline gave
each chapter.

    .venv/bin/python scripts/book_pdf.py   # writes _build/pdf/<book>.pdf
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import os
import shutil
import sys
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from pdf_edition import pdf_path as _pdf_path  # noqa: E402

SINGLE = ROOT / "_build" / "singlehtml"
PDF_DIR = ROOT / "_build" / "pdf"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PRINTED = "print.html"  # the single page, copied to the top of the build
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run"]


def book_title(root: Path = ROOT) -> str:
    return yaml.safe_load((root / "_config.yml").read_text("utf-8"))["title"]


def pdf_path(root: Path = ROOT) -> Path:
    """_build/pdf/<name>.pdf, where the HTML build looks for it (book/_ext/pdf_edition.py)."""
    return _pdf_path(root / "_build", book_title(root))


PRINT_CSS = """
@page { size: A4; margin: 16mm 14mm 18mm 14mm; }
html, body { background: white !important; }
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header-article,
.bd-footer, .bd-footer-article, .bd-footer-content, .prev-next-area, .headerlink,
.copybtn, .thebe-launch-button, #jb-print-docs-body, .skip-link, #pst-back-to-top {
  display: none !important;
}
.bd-container, .bd-container__inner, .bd-page-width, .bd-main, .bd-content,
.bd-article-container, article.bd-article {
  display: block !important; width: auto !important; max-width: none !important;
  min-width: 0 !important; margin: 0 !important; padding: 0 !important;
}
/* the theme hides each page's title in print, as it prints its own: not here */
.bd-main .bd-content .bd-article h1:first-of-type { display: block !important; }
/* code folded away on the site (the code that draws each picture) stays out */
details.hide.above-input { display: none !important; }
/* every chapter and appendix starts on a new page */
section.wgs-doc { break-before: page; }
pre, div.cell_output pre { white-space: pre-wrap !important; word-break: break-word; }
div.cell_output .output { overflow: visible !important; max-width: none !important; }
figure, img, svg, table { break-inside: avoid; }
/* a cell's input or output box moves whole to the next page rather than leaving an
   empty top edge at the foot of this one (a box taller than a page still breaks) */
div.cell_input, div.cell_output, div.highlight { break-inside: avoid; }
img { max-width: 100% !important; height: auto; }
nav.wgs-toc .wgs-cover { font-size: 2.4em; font-weight: bold; margin: 2em 0 0.2em 0; }
nav.wgs-toc .wgs-author { margin-bottom: 3em; }
nav.wgs-toc ol { list-style: none; padding-left: 0; }
nav.wgs-toc li.wgs-part { font-weight: bold; margin-top: 0.9em; }
nav.wgs-toc li.wgs-entry { display: flex; gap: 0.5em; margin: 0.25em 0 0.25em 1em; }
nav.wgs-toc li.wgs-entry a { color: inherit; text-decoration: none; }
nav.wgs-toc .wgs-dots { flex: 1; border-bottom: 1px dotted #888; margin-bottom: 0.3em; }
"""

# Makes the single page a book: each document (inlined where the introduction's
# table of contents stood, with its headings demoted) becomes a top-level section
# whose title is an h1 again, so that the PDF's outline lists chapters at the top
# level; opens the solutions; and puts a cover with the table of contents (parts and
# documents of _toc.yml; FILL_PAGES writes in the page numbers) first.
PREPARE = """([book, author, parts]) => {
  const article = document.querySelector('article.bd-article');
  const docs = [article.querySelector(':scope > section')];
  document.querySelectorAll('span[id^="document-"]').forEach(span => {
    const section = span.nextElementSibling;
    article.appendChild(span);
    article.appendChild(section);
    docs.push(section);
  });
  const expected = parts.reduce((n, [, count]) => n + count, 0);
  if (docs.length !== expected) throw new Error(`found ${docs.length} documents, not ${expected}`);
  for (const section of docs) {
    section.classList.add('wgs-doc');
    const title = section.querySelector('h1, h2, h3, h4, h5, h6');
    const shift = Number(title.tagName[1]) - 1;
    section.querySelectorAll('h1, h2, h3, h4, h5, h6').forEach(h => {
      const renamed = document.createElement('h' + Math.min(6, Number(h.tagName[1]) - shift));
      for (const attr of h.attributes) renamed.setAttribute(attr.name, attr.value);
      renamed.append(...h.childNodes);
      h.replaceWith(renamed);
    });
  }
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  document.querySelectorAll('button.toggle-button').forEach(b => b.remove());
  const titleOf = s => s.querySelector(':scope > h1').textContent.replace('#', '').trim();
  let html = `<p class="wgs-cover">${book}</p><p class="wgs-author">${author}</p>` +
             '<h1>Contents</h1><ol>';
  let index = 0;
  for (const [caption, count] of parts) {
    if (caption) html += `<li class="wgs-part">${caption}</li>`;
    for (let i = 0; i < count; i++, index++) {
      const section = docs[index];
      html += `<li class="wgs-entry"><a href="#${section.id}">${titleOf(section)}</a>` +
              `<span class="wgs-dots"></span><span class="wgs-page">000</span></li>`;
    }
  }
  const nav = document.createElement('nav');
  nav.className = 'wgs-toc';
  nav.innerHTML = html + '</ol>';
  article.prepend(nav);
  return docs.map(titleOf);
}"""

FOOTER = (
    '<div style="font-size:8px;width:100%;text-align:center;color:#555">'
    '<span class="pageNumber"></span> / <span class="totalPages"></span></div>'
)


def root_doc(root: Path = ROOT) -> str:
    """The single page's name: the root document of _toc.yml (book/intro)."""
    return yaml.safe_load((root / "_toc.yml").read_text("utf-8"))["root"]


def toc_parts(root: Path = ROOT) -> list[tuple[str, int]]:
    """(caption, number of documents) for the root page and each part of _toc.yml."""
    toc = yaml.safe_load((root / "_toc.yml").read_text("utf-8"))

    def count(entries):
        return sum(1 + count(e.get("sections")) for e in entries or [])

    parts = [("", 1)]  # the root page (the introduction)
    parts += [(p.get("caption", ""), count(p.get("chapters"))) for p in toc.get("parts", [])]
    if toc.get("chapters"):
        parts.append(("", count(toc["chapters"])))
    return parts


@contextlib.contextmanager
def serve(directory: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def chapter_pages(pdf: bytes) -> list[int]:
    """1-based first page of each document, from the PDF's top-level outline (the h1s).

    The first entry is the table of contents itself. Titles are not compared here:
    Chromium drops the space where a long title wraps in the outline's text.
    """
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(pdf))
    tops = [item for item in reader.outline if not isinstance(item, list)]
    return [reader.get_destination_page_number(item) + 1 for item in tops[1:]]


FILL_PAGES = """pages => document.querySelectorAll('nav.wgs-toc .wgs-page')
  .forEach((span, i) => { span.textContent = pages[i]; })"""


class PrintError(Exception):
    pass


def print_book(url: str) -> bytes:
    """The book printed twice in one browser page: a draft to learn on which page each
    document starts, then the final print with those numbers in the contents."""
    from playwright.sync_api import sync_playwright

    config = yaml.safe_load((ROOT / "_config.yml").read_text("utf-8"))
    book = [config["title"], config.get("author", "")]
    options = {
        "print_background": True,
        "prefer_css_page_size": True,
        "display_header_footer": True,
        "header_template": "<span></span>",
        "footer_template": FOOTER,
        "outline": True,
        "tagged": True,
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        # Nothing leaves this machine: the book is printed from its own files.
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(url) else r.abort())
        page.goto(f"{url}/{PRINTED}", wait_until="load")
        page.evaluate("async () => { await window.MathJax?.startup?.promise; }")
        page.emulate_media(media="print")
        page.add_style_tag(content=PRINT_CSS)
        titles = page.evaluate(PREPARE, [*book, toc_parts()])
        pages = chapter_pages(page.pdf(**options))
        if len(pages) != len(titles):
            raise PrintError(f"{len(titles)} documents, but {len(pages)} in the PDF's outline")
        page.evaluate(FILL_PAGES, pages)
        pdf = page.pdf(**options)
        browser.close()
    if chapter_pages(pdf) != pages:
        raise PrintError("the documents moved to other pages between the two prints")
    return pdf


def main() -> int:
    index = SINGLE / f"{root_doc()}.html"
    if not index.is_file():
        print(f"book_pdf: {index} is missing; build it first (make pdf does).", file=sys.stderr)
        return 1
    # The single page's links to _static/ are written as if it sat at the top of the
    # build (a Jupyter Book quirk when the root document is in a folder): put it there.
    shutil.copy(index, SINGLE / PRINTED)
    try:
        with serve(SINGLE) as url:
            pdf = print_book(url)
    except PrintError as error:
        print(f"book_pdf: {error}", file=sys.stderr)
        return 1
    target = pdf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(pdf)
    print(f"The book is at {target} ({len(pdf) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
