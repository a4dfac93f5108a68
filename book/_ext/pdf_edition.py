"""Sphinx extension: what the whole-book PDF (`make pdf`) needs from the build.

- The single-page build that `make pdf` prints renders every node the HTML build
  does. Sphinx looks up the HTML handlers of an extension's nodes under the builder's
  name first and falls back to its format ("html") only when no extension registered
  any handler for that name; sphinx-exercise registers some for "singlehtml", so
  every other extension's nodes (MyST-NB's, Jupyter Book's) would be unknown there.
  Here the "singlehtml" handlers get the "html" ones they lack.
- Once `make pdf` has printed ``_build/pdf/<name>.pdf``, the HTML build copies it to
  the site's root and sets the tag ``pdf_built``, which shows the introduction's
  download link (an ``{only}`` block); before that the link is simply not there.
"""

import re
import shutil
from pathlib import Path


def pdf_name(title: str) -> str:
    """The PDF's file name, made from the book's title: where-gradients-stop.pdf."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") + ".pdf"


def pdf_path(build_dir: Path, title: str) -> Path:
    return Path(build_dir) / "pdf" / pdf_name(title)


def _the_pdf(app) -> Path:
    return pdf_path(Path(app.outdir).parent, app.config.html_title)


def _offer_the_pdf(app, config):
    if _the_pdf(app).is_file():
        app.tags.add("pdf_built")


def _copy_the_pdf(app, exception):
    # Copied at the end of every HTML build, even one with nothing else to write.
    pdf = _the_pdf(app)
    if exception is None and app.builder.name == "html" and pdf.is_file():
        shutil.copyfile(pdf, Path(app.outdir) / pdf.name)


def _html_handlers_for_singlehtml(app):
    handlers = app.registry.translation_handlers
    if app.builder.name == "singlehtml" and "singlehtml" in handlers:
        for node, pair in handlers.get("html", {}).items():
            handlers["singlehtml"].setdefault(node, pair)


def setup(app):
    app.connect("config-inited", _offer_the_pdf)
    app.connect("builder-inited", _html_handlers_for_singlehtml)
    app.connect("build-finished", _copy_the_pdf)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
