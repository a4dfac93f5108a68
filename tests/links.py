"""Every internal link and anchor of the built site, checked from its files.

The pages are those reached from ``index.html`` by following links, as a reader (or a
crawler) would; the theme's template files under ``_static/`` are not pages. Each HTML
page is read once with the standard library's parser: the ids (and the old-style
``<a name>``) it defines, and every address it points to (``href`` of links and
stylesheets, ``src`` of images, scripts and frames, a ``<meta>`` redirect's URL). An
address outside the book (``http:``, ``https:``, ``mailto:``, ``data:``,
``javascript:``) is not this check's business: there is no network here. Every other
address must name a file that exists, and where it carries a ``#fragment`` into an
HTML page, an id on that page.

``broken_links(site)`` returns one line per problem, ``[]`` when every link resolves;
``count_links(site)`` how many addresses it checked (so a test can tell that it saw
the book).
"""

from __future__ import annotations

from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

OUTSIDE = ("http:", "https:", "mailto:", "data:", "javascript:", "tel:")
POINTING = {
    "a": "href",
    "link": "href",
    "area": "href",
    "img": "src",
    "script": "src",
    "iframe": "src",
    "source": "src",
}


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.addresses: list[str] = []

    def handle_starttag(self, tag, attrs):
        named = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if named.get(key):
                self.ids.add(named[key])
        wanted = POINTING.get(tag)
        if wanted and named.get(wanted):
            self.addresses.append(named[wanted].strip())
        refresh = (named.get("http-equiv") or "").lower() == "refresh"
        if tag == "meta" and refresh and "url=" in (named.get("content") or "").lower():
            content = named["content"]  # "0; url=book/intro.html": a redirect
            self.addresses.append(content[content.lower().index("url=") + 4 :].strip())

    handle_startendtag = handle_starttag


def _reader():
    """A page reader that reads each file once per check (files may change between)."""

    @cache
    def read(page: Path) -> _Page:
        parsed = _Page()
        parsed.feed(page.read_text("utf-8", errors="replace"))
        parsed.close()
        return parsed

    return read


def _target(site: Path, page: Path, address: str) -> tuple[Path, str] | None:
    """The file an address inside the book names, and its fragment; None if outside."""
    if not address or address.lower().startswith(OUTSIDE):
        return None
    parts = urlsplit(address)
    if parts.scheme or parts.netloc:
        return None  # another scheme or a host: outside the book
    if parts.path.startswith("/"):
        target = site / unquote(parts.path).lstrip("/")
    elif parts.path:
        target = page.parent / unquote(parts.path)
    else:
        target = page
    if target.is_dir():
        target = target / "index.html"
    return target.resolve(), unquote(parts.fragment)


def _pages(site: Path, read) -> list[Path]:
    """The HTML pages reached from index.html, following links within the site."""
    start = (Path(site) / "index.html").resolve()
    if not start.is_file():
        raise FileNotFoundError(f"{site} has no index.html: is it a built site?")
    seen, todo = {start}, [start]
    while todo:
        page = todo.pop()
        for address in read(page).addresses:
            found = _target(site, page, address)
            if found and found[0].suffix == ".html" and found[0].is_file():
                if found[0] not in seen and found[0].is_relative_to(start.parent):
                    seen.add(found[0])
                    todo.append(found[0])
    return sorted(seen)


def _problem(site: Path, page: Path, address: str, read) -> str | None:
    found = _target(site, page, address)
    if found is None:
        return None
    target, fragment = found
    where = f"{page.relative_to(site)}: {address}"
    if not target.is_relative_to(site):
        return f"{where}: leaves the site"
    if not target.is_file():
        return f"{where}: no such file"
    if fragment and target.suffix == ".html" and fragment not in read(target).ids:
        return f"{where}: no anchor #{fragment} on {target.relative_to(site)}"
    return None


def broken_links(site: Path) -> list[str]:
    """One line per internal link or anchor of ``site`` that does not resolve."""
    site, read = Path(site).resolve(), _reader()
    problems = []
    for page in _pages(site, read):
        for address in read(page).addresses:
            problem = _problem(site, page, address, read)
            if problem:
                problems.append(problem)
    return problems


def count_links(site: Path) -> int:
    """How many addresses inside the book ``broken_links`` checks."""
    site, read = Path(site).resolve(), _reader()
    return sum(
        1
        for page in _pages(site, read)
        for address in read(page).addresses
        if _target(site, page, address) is not None
    )
