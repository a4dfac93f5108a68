"""What counts as alt text, shared by the static and the browser checks of the site.

Sphinx gives an image written without ``:alt:`` the image's own path as its alt
(``alt="../_images/probe.png"``), and MyST-NB does the same for a plot a cell
shows; Markdown's ``![](probe.png)`` gives an empty alt. None of these tells a
reader who cannot see the picture what it shows.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

_FILE_NAME = re.compile(r"^[\w./\\:-]+\.(png|jpe?g|gif|svg|webp|bmp|ico)$", re.I)


def alt_problem(src: str, alt: str | None) -> str | None:
    """Why ``alt`` is no alt text for the image at ``src``, or None if it is one."""
    alt = (alt or "").strip()
    if not alt:
        return "has no alt text"
    if src.startswith("data:"):
        names = set()
    else:
        path = unquote(urlparse(src).path)
        names = {src, path, PurePosixPath(path).name, PurePosixPath(path).stem}
    if alt in names or _FILE_NAME.match(alt):
        return f"has its file name for alt text ({alt[:60]!r}): Sphinx's default, not a description"
    return None
