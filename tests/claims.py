"""The claims map: every Summary bullet links to the section whose check proves it.

A proving section is a heading with a MyST label on the line above it::

    (ch3-saved-input)=
    ## It breaks a backward that saved the tensor as an input

A Summary bullet links to it with ``{ref}`ch3-saved-input``` or
``{ref}`the sweep <ch3-saved-input>```. The section runs from its heading to the next
heading of the same or a higher level; it must hold a check that can fail: an
``assert`` statement, a ``torch.testing.assert_close`` call, or a cell that declares
an ``expected_error``. Several label lines may stand above one heading; each names it.

A "Going deeper" box has no headings (the build refuses them), so a label may also
stand above the first paragraph inside one: that section is the box, from the label
to ``{going-deeper-end}``, and is titled by its ``{going-deeper-start}`` line.

The same test covers two appendices:

- the cheat sheet: every row of its table is a line of the sheet (a sheet without a
  table: every paragraph after its first ``## `` heading), and must link to its proof
  the same way;
- the error index: every entry of ``book/error-explanations.yml`` names the sections
  that prove it in a ``proof`` list of labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

LABEL = re.compile(r"^\((?P<label>[A-Za-z0-9_.:-]+)\)=\s*$")
HEADING = re.compile(r"^(?P<hashes>#{1,6}) \S")
DEEPER_START = re.compile(r"^:::\{going-deeper-start\}\s*(?P<title>.*)$")
DEEPER_END = re.compile(r"^:::\{going-deeper-end\}")
BOX = 7  # a box's "level": below every heading, closed by its end marker
REF = re.compile(r"\{ref\}`(?:[^`<]*<(?P<target>[^>`]+)>|(?P<bare>[^`<>]+))`")
CHECK = re.compile(r"^\s*assert\b|assert_close\(", re.M)


@dataclass
class Section:
    label: str
    notebook: Path
    title: str
    checks: int = 0


@dataclass
class Book:
    sections: dict[str, Section] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)


def refs_in(text: str) -> list[str]:
    """The labels a piece of MyST text links to with {ref}."""
    return [(m["target"] or m["bare"]).strip() for m in REF.finditer(text)]


def _cell_counts_as_check(cell) -> bool:
    if cell.cell_type != "code":
        return False
    return bool(CHECK.search(cell.source)) or "expected_error" in cell.metadata


def sections_of(path: Path) -> list[Section]:
    """The labelled sections of one notebook, each with the number of checks in it."""
    nb = nbformat.read(path, as_version=4)
    found: list[tuple[Section, int]] = []  # (section, its heading level)
    open_sections: list[tuple[Section, int]] = []
    box_title: str | None = None  # inside a Going deeper box: its title
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            pending: list[str] = []
            for line in cell.source.splitlines():
                label = LABEL.match(line)
                heading = HEADING.match(line)
                if start := DEEPER_START.match(line):
                    box_title = start["title"].strip()
                elif DEEPER_END.match(line):
                    box_title = None
                    open_sections = [(s, lv) for s, lv in open_sections if lv < BOX]
                elif label:
                    pending.append(label["label"])
                elif heading:
                    level = len(heading["hashes"])
                    open_sections = [(s, lv) for s, lv in open_sections if lv < level]
                    for name in pending:
                        section = Section(name, path, line.lstrip("# ").strip())
                        found.append((section, level))
                        open_sections.append((section, level))
                    pending = []
                elif line.strip():
                    if box_title is not None:
                        for name in pending:
                            section = Section(name, path, box_title)
                            found.append((section, BOX))
                            open_sections.append((section, BOX))
                    pending = []
        elif _cell_counts_as_check(cell):
            for section, _ in open_sections:
                section.checks += 1
    return [s for s, _ in found]


def read_book(notebooks: list[Path]) -> Book:
    book = Book()
    for path in notebooks:
        for section in sections_of(path):
            if section.label in book.sections:
                book.duplicates.append(section.label)
            book.sections[section.label] = section
    return book


def summary_bullets(path: Path) -> list[str]:
    """The bullets of a chapter's '## Summary', each with its continuation lines."""
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    if "## Summary" not in markdown:
        return []
    body = markdown.split("## Summary", 1)[1].split("\n## ", 1)[0]
    bullets: list[str] = []
    for line in body.splitlines():
        if line.startswith("- "):
            bullets.append(line[2:])
        elif bullets and line.startswith("  ") and line.strip():
            bullets[-1] += " " + line.strip()
    return bullets


def link_problems(text: str, book: Book, where: str) -> list[str]:
    """What is wrong with the proof links of one claim (a bullet, a line)."""
    labels = refs_in(text)
    short = text if len(text) <= 70 else text[:67] + "..."
    if not labels:
        return [f"{where}: no {{ref}} link to a proving section: {short!r}"]
    problems = []
    for label in labels:
        section = book.sections.get(label)
        if section is None:
            problems.append(f"{where}: link to '{label}', which labels no section")
        elif section.checks == 0:
            problems.append(f"{where}: '{label}' ({section.title}) holds no check that can fail")
    return problems


def summary_problems(path: Path, book: Book) -> list[str]:
    bullets = summary_bullets(path)
    if not bullets:
        return [f"{path.name}: no Summary bullets found"]
    problems = []
    for number, bullet in enumerate(bullets, 1):
        problems += link_problems(bullet, book, f"{path.name}, bullet {number}")
    return problems


def _table_rows(markdown: str) -> list[str]:
    """The body rows of every Markdown table in the text (not its header or rule)."""
    rows: list[str] = []
    block: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            block.append(line.strip())
            continue
        if len(block) > 2 and set(block[1]) <= set("|-: "):
            rows += block[2:]
        block = []
    return rows


def cheatsheet_lines(path: Path) -> list[str]:
    """The lines of the cheat sheet: the rows of its table.

    A sheet written as sections instead (no table) has a line per paragraph after its
    first '## ' heading.
    """
    nb = nbformat.read(path, as_version=4)
    markdown = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
    rows = [row for source in markdown for row in _table_rows(source)]
    if rows:
        return rows
    lines: list[str] = []
    started = False
    for source in markdown:
        for paragraph in source.split("\n\n"):
            rows = [r for r in paragraph.splitlines() if r.strip()]
            if any(r.startswith("## ") for r in rows):
                started = True
            prose = [r for r in rows if not (LABEL.match(r) or HEADING.match(r))]
            if started and prose:
                lines.append(" ".join(r.strip() for r in prose))
    return lines


def cheatsheet_problems(path: Path, book: Book) -> list[str]:
    lines = cheatsheet_lines(path)
    if not lines:
        return [f"{path.name}: no table rows, and no lines after a '## ' heading"]
    problems = []
    for number, line in enumerate(lines, 1):
        problems += link_problems(line, book, f"{path.name}, line {number}")
    return problems


def explanation_problems(explanations: dict, book: Book) -> list[str]:
    """Each error explanation must name, under 'proof', labelled sections with a check."""
    problems = []
    for key, entry in explanations.items():
        where = f"error-explanations.yml, {key[:40]!r}"
        proof = entry.get("proof") if isinstance(entry, dict) else None
        if not proof or not isinstance(proof, list):
            problems.append(f"{where}: no 'proof' list of labels")
            continue
        problems += link_problems(" ".join(f"{{ref}}`{label}`" for label in proof), book, where)
    return problems
