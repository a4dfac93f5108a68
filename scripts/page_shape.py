#!/usr/bin/env python3
"""The shape of a built page: what its reader's path shows, measured from the HTML.

    python scripts/page_shape.py [_build/html]     print the table for every page

A page has two layers (CONTRIBUTING.md, "Two layers"): the *reader's path*, what the
page shows before any click, and the *proof layer*, folded one click away (a cell
tagged ``check``, a ``hide-input`` cell's code, a "Going deeper" box, an exercise's
solution). Everything here is measured on the reader's path only, except the width of
printed lines, which must fit the code column wherever the reader opens them.

``tests/test_page_shape.py`` holds each chapter to ``BUDGET``; ``make bench`` and
``make quick`` print the same table.
"""

from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from bs4 import BeautifulSoup, Tag

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import nbcheck  # noqa: E402

SHORT_ANSWER = "The short answer"
# What the reader's path of a chapter may hold (STYLE.md, "Two layers").
BUDGET = {
    "words": 2000,  # visible prose
    "cells": 30,  # visible code cells
    "longest cell": 14,  # lines
    "short answer words": 130,  # "the rule in at most ~120 words"
    "minutes": 15,  # the estimate below: prose at 200 words a minute, 20 s per cell
}
SHORT_CELL = 8  # lines; "mostly" means at least this share of the visible cells:
SHORT_SHARE = 0.75
WIDTH = 80  # characters a printed line may take (the code column)
# A cell that prints a source post's own lines, as the post shows them: they keep the
# post's width (the seed-coverage appendix compares them line for line) and wrap
# instead (book.css), as error messages and warnings do.
POST_OUTPUT = "tag_post-output"
WORDS_PER_MINUTE = 200
SECONDS_PER_CELL = 20
ASSERT = re.compile(r"^\s*assert\b|\bassert_\w+\(|\btorch\.testing\.assert", re.M)
PROSE = {"p", "ul", "ol", "dl", "blockquote", "table"}
WORD = re.compile(r"[^\W\d_][\w'’-]*|\d[\d.,]*", re.U)


def _folded(tag: Tag) -> bool:
    """True if the reader must click to see ``tag`` (a <details>, a solution dropdown)."""
    for parent in tag.parents:
        if parent.name == "details":
            return True
        classes = parent.get("class") or []
        if parent.name == "div" and "dropdown" in classes:
            return True
    return False


def _cell_input(cell: Tag) -> Tag | None:
    return cell.find("div", class_="cell_input")


def _cell_output(cell: Tag) -> Tag | None:
    return cell.find("div", class_="cell_output")


def _lines(block: Tag) -> list[str]:
    pre = block.find("pre")
    text = pre.get_text() if pre else block.get_text()
    return text.rstrip("\n").split("\n")


def _words(text: str) -> int:
    return len(WORD.findall(text))


def _article(soup: BeautifulSoup) -> Tag:
    article = soup.select_one("article.bd-article")
    if article is None:
        raise ValueError("not a page of this book: no <article class='bd-article'>")
    return article


def _visible_prose_words(article: Tag) -> int:
    article = copy.copy(article)
    removed = "div.cell, details, div.dropdown, script, style, a.headerlink, p.verified-stamp"
    for tag in article.select(removed):
        tag.decompose()
    return _words(article.get_text(" "))


def _is_quiet(tag: Tag) -> bool:
    """Blocks a 'what to notice' sentence may sit beyond: folded checks and boxes, anchors."""
    if tag.name in ("details", "span", "script"):
        return True
    if tag.name == "div" and "cell" in (tag.get("class") or []):
        inp, out = _cell_input(tag), _cell_output(tag)
        shown_in = inp is not None and not _folded(inp)
        shown_out = out is not None and not _folded(out)
        return not shown_in and not shown_out
    return False


def _says_what_to_notice(tag: Tag | None) -> bool:
    if tag is None:
        return False
    classes = tag.get("class") or []
    if tag.name in PROSE:
        return True
    return tag.name == "div" and "admonition" in classes and "hide" not in classes


def _neighbour(cell: Tag, step: str) -> Tag | None:
    sibling = getattr(cell, step)
    while sibling is not None and (not isinstance(sibling, Tag) or _is_quiet(sibling)):
        sibling = getattr(sibling, step)
    return sibling


def _noticed(cell: Tag) -> bool:
    """An output shown on the path has a sentence beside it, or is a captioned figure."""
    output = _cell_output(cell)
    if output.find("figcaption") is not None:
        return True
    before = _neighbour(cell, "previous_sibling")
    after = _neighbour(cell, "next_sibling")
    return _says_what_to_notice(before) or _says_what_to_notice(after)


@dataclass
class Shape:
    page: str
    words: int
    cells: int
    longest_cell: int
    short_cells: float  # share of visible cells with at most SHORT_CELL lines
    visible_asserts: int
    wide_lines: int  # printed lines wider than WIDTH, folded or not (errors wrap)
    widest: int
    unnoticed: int  # outputs on the path with no sentence beside them
    checks_with_output: int  # cells tagged check that print something
    short_answer: str  # the first section's title
    short_answer_words: int
    short_answer_cells: int
    minutes: float

    def row(self) -> dict:
        return {f.name.replace("_", " "): getattr(self, f.name) for f in fields(self)}


def _short_answer(top: Tag) -> tuple[str, int, int]:
    section = top.find("section")
    if section is None:
        return "", 0, 0
    heading = section.find(["h2", "h3"])
    title = heading.get_text(" ", strip=True).rstrip("#").strip() if heading else ""
    own = copy.copy(section)
    for sub in own.find_all("section"):
        sub.decompose()
    cells = [c for c in own.select("div.cell") if not _folded(_cell_input(c) or c)]
    return title, _visible_prose_words(own) - _words(title), len(cells)


def measure(soup: BeautifulSoup, page: str = "") -> Shape:
    """The figures of one built page."""
    article = _article(soup)
    cells = article.select("div.cell")
    shown = [c for c in cells if _cell_input(c) is not None and not _folded(_cell_input(c))]
    lengths = [len(_lines(_cell_input(c))) for c in shown]
    asserts = sum(len(ASSERT.findall(_cell_input(c).get_text())) for c in shown)
    wide = []
    for out in article.select("div.cell_output div.output"):
        if {"traceback", "stderr"} & set(out.get("class") or []):
            continue  # long error messages and warnings wrap (book.css)
        if out.find_parent("div", class_=POST_OUTPUT) is not None:
            continue  # a post's own lines, which wrap too
        if out.find("pre") is None:
            continue  # a figure or other HTML output: its caption and text wrap
        wide += [len(line) for line in _lines(out) if len(line) > WIDTH]
    with_output = [c for c in shown if _cell_output(c) is not None]
    with_output += [
        c
        for c in cells
        if c not in shown and _cell_output(c) is not None and not _folded(_cell_output(c))
    ]
    checks = [c for c in cells if "tag_check" in (c.get("class") or [])]
    title, sa_words, sa_cells = _short_answer(article.find("section"))
    words = _visible_prose_words(article)
    short = round(sum(n <= SHORT_CELL for n in lengths) / len(lengths), 2) if lengths else 1.0
    return Shape(
        page=page,
        words=words,
        cells=len(shown),
        longest_cell=max(lengths, default=0),
        short_cells=short,
        visible_asserts=asserts,
        wide_lines=len(wide),
        widest=max(wide, default=0),
        unnoticed=sum(not _noticed(c) for c in with_output),
        checks_with_output=sum(_cell_output(c) is not None for c in checks),
        short_answer=title,
        short_answer_words=sa_words,
        short_answer_cells=sa_cells,
        minutes=round(words / WORDS_PER_MINUTE + len(shown) * SECONDS_PER_CELL / 60, 1),
    )


def chapter_problems(shape: Shape) -> list[str]:
    """Where a chapter's reader's path breaks the book's budget (empty when it fits)."""
    problems = page_problems(shape)
    if shape.short_answer != SHORT_ANSWER:
        problems.append(f"its first section is {shape.short_answer!r}, not {SHORT_ANSWER!r}")
    if shape.short_answer_words > BUDGET["short answer words"]:
        problems.append(
            f"the short answer has {shape.short_answer_words} words "
            f"(at most {BUDGET['short answer words']})"
        )
    if shape.short_answer_cells < 1:
        problems.append("the short answer has no runnable example (a visible code cell)")
    if shape.words > BUDGET["words"]:
        problems.append(f"{shape.words} words of visible prose (at most {BUDGET['words']})")
    # words and cells each within budget can still add up to 20 minutes together
    if shape.minutes > BUDGET["minutes"]:
        problems.append(
            f"{shape.minutes} minutes to read the main path (at most {BUDGET['minutes']})"
        )
    if shape.cells > BUDGET["cells"]:
        problems.append(f"{shape.cells} visible code cells (at most {BUDGET['cells']})")
    if shape.longest_cell > BUDGET["longest cell"]:
        problems.append(
            f"a visible cell of {shape.longest_cell} lines (at most {BUDGET['longest cell']})"
        )
    if shape.short_cells < SHORT_SHARE:
        problems.append(
            f"only {shape.short_cells:.0%} of the visible cells have at most {SHORT_CELL} lines "
            f"(at least {SHORT_SHARE:.0%})"
        )
    if shape.unnoticed:
        problems.append(
            f"{shape.unnoticed} output(s) on the path with no sentence beside them "
            "(say what to notice, before or after)"
        )
    return problems


def page_problems(shape: Shape) -> list[str]:
    """What no page of the book may do, chapter or appendix."""
    problems = []
    if shape.visible_asserts:
        problems.append(
            f"{shape.visible_asserts} visible assert(s) on the reader's path "
            "(tag the cell 'check', or move it into a Going deeper box)"
        )
    if shape.wide_lines:
        problems.append(
            f"{shape.wide_lines} printed line(s) wider than {WIDTH} characters "
            f"(widest {shape.widest})"
        )
    if shape.checks_with_output:
        problems.append(
            f"{shape.checks_with_output} cell(s) tagged 'check' print something "
            "(a check prints nothing: show the value in the cell before it)"
        )
    return problems


def measure_site(html_root: Path, docs: list[str] | None = None) -> list[Shape]:
    docs = docs if docs is not None else nbcheck.toc_files()
    return [measure(nbcheck.built_page(html_root, doc), doc) for doc in docs]


def table(shapes: list[Shape]) -> str:
    """The figures as a Markdown table, one page a row."""
    columns = ["page", "minutes", "words", "cells", "longest", "≤8 lines", "asserts"]
    columns += ["wide", "unnoticed", "short answer"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for s in shapes:
        answer = f"{s.short_answer_words} w, {s.short_answer_cells} c" if s.short_answer else "–"
        if s.short_answer and s.short_answer != SHORT_ANSWER:
            answer = f"({s.short_answer[:24]})"
        values = [s.page, s.minutes, s.words, s.cells, s.longest_cell, f"{s.short_cells:.0%}"]
        values += [s.visible_asserts, s.wide_lines, s.unnoticed, answer]
        rows.append("| " + " | ".join(str(v) for v in values) + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    html_root = Path(argv[0]) if argv else ROOT / "_build" / "html"
    if not (html_root / "index.html").exists():
        print(f"page_shape: no built book in {html_root}: run 'make book' first", file=sys.stderr)
        return 2
    print(table(measure_site(html_root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
