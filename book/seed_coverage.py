"""The seed-coverage appendix: the source posts, line by line, against the book.

For every code block of the three posts (``seed-posts.yml``) the appendix shows

- the lines the post printed;
- what the post's own code prints today, run here (``run_post``);
- what the book's sections that run the example print (``run_sections``): the
  chapters' code cells are executed from the top, and each cell's printed lines (and
  the error of a cell declared to fail) are credited to the labelled sections it sits
  in, the same sections the claims map uses;

and, for each printed line, whether the book's sections print the post's line, today's
line, both, or neither (``book_status``: "same" when the two agree and the book prints
them; "today's line", "the post's line", "both lines"; or ``"missing"``). Nothing is
typed in by hand: a post's print that no section of the book reproduces comes out as
``"missing"``.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

LABEL = re.compile(r"^\((?P<label>[A-Za-z0-9_.:-]+)\)=\s*$")
HEADING = re.compile(r"^(?P<hashes>#{1,6}) \S")
ADDRESS = re.compile(r" at 0x[0-9a-f]+")
ERROR_LINE = re.compile(r"^(?P<type>\w+(?:Error|Exception)): ")
MISSING = "missing"


class SeedCoverageError(RuntimeError):
    """A book section could not be run the way the appendix needs."""


def load_posts(path: Path | str) -> list[dict]:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def normal(line: str, translate: dict[str, str] | None = None) -> str:
    """A printed line as compared: labels translated, addresses masked, spaces collapsed."""
    for source, target in (translate or {}).items():
        line = line.replace(source, target)
    line = ADDRESS.sub(" at 0x…", line)
    return " ".join(line.split())


def _key(line: str, translate: dict[str, str]) -> str:
    """What must agree for two lines to be paired: an error's type, or the whole line."""
    error = ERROR_LINE.match(line.strip())
    return f"error {error['type']}" if error else normal(line, translate)


def _same(post_line: str, other: str, translate: dict[str, str]) -> bool:
    """Equal once normalised; a post's error line may be cut short, so a prefix will do."""
    post_line, other = normal(post_line, translate), normal(other, translate)
    if ERROR_LINE.match(post_line):
        return other.startswith(post_line)
    return post_line == other


# -- the posts' code, run today -------------------------------------------------------


def _run(code: str, namespace: dict) -> tuple[list[str], str | None]:
    """Run code in namespace: its printed lines, and 'Type: message' if it raised."""
    buffer = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # stderr is not part of what is compared
            exec(compile(code, "<cell>", "exec"), namespace)
    except Exception as err:  # noqa: BLE001 - a post's errors are part of its output
        error = f"{type(err).__name__}: {err}"
    return buffer.getvalue().splitlines(), error


def _printed(code: str, namespace: dict) -> list[str]:
    """The lines code prints, its error last; object addresses masked (they vary)."""
    lines, error = _run(code, namespace)
    return [ADDRESS.sub(" at 0x…", line) for line in lines + ([error] if error else [])]


def run_post(post: dict) -> list[list[str]]:
    """Today's printed lines of each block of one post, run as the post means it."""
    import torch

    results, namespace = [], None
    for block in post["blocks"]:
        if not block.get("continues") or namespace is None:
            namespace = {"__name__": "__main__"}
        if "seed" in block:
            torch.manual_seed(block["seed"])
        if "setup" in block:
            _run(block["setup"], namespace)
        results.append(_printed(block["code"], namespace))
    return results


# -- the book's sections, run ---------------------------------------------------------


@dataclass
class Section:
    label: str
    notebook: Path
    title: str
    lines: list[str] = field(default_factory=list)
    cells: int = 0


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def labelled_cells(path: Path):
    """Each cell of a notebook with the labels of the sections it sits in.

    A section runs from its labelled heading to the next heading of the same or a
    higher level (as in tests/claims.py); several labels may name one heading.
    """
    open_sections: list[tuple[str, int, str]] = []
    for cell in _cells(path):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            pending: list[str] = []
            for line in source.splitlines():
                label, heading = LABEL.match(line), HEADING.match(line)
                if label:
                    pending.append(label["label"])
                elif heading:
                    level = len(heading["hashes"])
                    open_sections = [s for s in open_sections if s[1] < level]
                    title = line.lstrip("# ").strip()
                    open_sections += [(name, level, title) for name in pending]
                    pending = []
                elif line.strip():
                    pending = []
        yield cell, source, list(open_sections)


def find_sections(notebooks: list[Path]) -> dict[str, Path]:
    """Which notebook holds each labelled section."""
    found = {}
    for path in notebooks:
        for _, _, sections in labelled_cells(path):
            for label, _, _ in sections:
                found.setdefault(label, path)
    return found


@contextlib.contextmanager
def _working_dir(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        os.chdir(before)


def _without_magics(source: str) -> str:
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


def run_sections(path: Path, labels: set[str]) -> dict[str, Section]:
    """Run a notebook's code cells from the top until every wanted section is done.

    Returns, for each wanted label, the lines its cells printed (and the error line of
    each cell declared to fail). An undeclared error stops everything, naming the cell.
    """
    path = Path(path).resolve()
    sections: dict[str, Section] = {}
    namespace = {"__name__": "__main__"}
    with _working_dir(path.parent):
        for index, (cell, source, open_now) in enumerate(labelled_cells(path)):
            for label, _, title in open_now:
                if label in labels and label not in sections:
                    sections[label] = Section(label, path, title)
            done = [s for s in sections if s not in {o[0] for o in open_now}]
            if set(done) >= labels:
                break
            if cell["cell_type"] != "code":
                continue
            declared = cell.get("metadata", {}).get("expected_error")
            lines, error = _run(_without_magics(source), namespace)
            if error and not (declared and error.startswith(declared["type"] + ": ")):
                raise SeedCoverageError(f"{path.name}, cell {index}: {error}")
            lines += [error] if error else []
            for label, _, _ in open_now:
                if label in sections:
                    sections[label].lines += lines
                    sections[label].cells += 1
    missing = labels - set(sections)
    if missing:
        raise SeedCoverageError(f"{path.name}: no section labelled {sorted(missing)}")
    return sections


def run_book(posts: list[dict], notebooks: list[Path]) -> dict[str, Section]:
    """Every section the posts' blocks name, run: label -> Section."""
    wanted = {label for post in posts for block in post["blocks"] for label in block["sections"]}
    where = find_sections(notebooks)
    unknown = wanted - set(where)
    if unknown:
        raise SeedCoverageError(f"no notebook has a section labelled {sorted(unknown)}")
    sections: dict[str, Section] = {}
    for path in dict.fromkeys(where[label] for label in sorted(wanted, key=str)):
        sections.update(run_sections(path, {lb for lb in wanted if where[lb] == path}))
    return sections


# -- the rows of the table ------------------------------------------------------------


def align(post_lines: list[str], today_lines: list[str], translate=None):
    """Pair the post's printed lines with today's, in order; None where one has no match."""
    translate = translate or {}
    a = [_key(line, translate) for line in post_lines]
    b = [_key(line, translate) for line in today_lines]
    pairs = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for _, i1, i2, j1, j2 in matcher.get_opcodes():
        post, today = post_lines[i1:i2], today_lines[j1:j2]
        for k in range(max(len(post), len(today))):
            pairs.append((post[k] if k < len(post) else None, today[k] if k < len(today) else None))
    return pairs


def book_status(post_line, today_line, book_lines, translate=None) -> str:
    """Which of the post's line and today's line the book's sections print."""
    translate = translate or {}
    has = {
        name: line is not None and any(_same(line, b, translate) for b in book_lines)
        for name, line in (("post", post_line), ("today", today_line))
    }
    same = (
        post_line is not None and today_line is not None and _same(post_line, today_line, translate)
    )
    if same and (has["post"] or has["today"]):
        return "same"
    if has["post"] and has["today"]:
        return "both lines"
    if has["today"]:
        return "today's line"
    if has["post"]:
        return "the post's line"
    return MISSING


def block_rows(block: dict, today: list[str], sections: dict[str, Section], translate=None):
    """The rows of one block: its code, then one row per printed line (post or today)."""
    book_lines = [line for label in block["sections"] for line in sections[label].lines]
    rows = [
        {
            "kind": "code",
            "example": block["example"],
            "post": block["code"],
            "today": None,
            "sections": block["sections"],
            "book": "runs" if all(sections[s].cells for s in block["sections"]) else MISSING,
        }
    ]
    for post_line, today_line in align(block["printed"], today, translate):
        rows.append(
            {
                "kind": "printed",
                "example": block["example"],
                "post": post_line,
                "today": today_line,
                "sections": block["sections"],
                "book": book_status(post_line, today_line, book_lines, translate),
            }
        )
    return rows


def _code(text: str | None) -> str:
    if text is None:
        return "—"
    text = text.replace("|", "\\|").strip()
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def markdown_table(rows: list[dict]) -> str:
    """The rows as a MyST table; the book column links each section with {ref}."""
    out = ["| the post | today, the post's code run here | the book |", "|---|---|---|"]
    for row in rows:
        links = ", ".join(f"{{ref}}`{label}`" for label in row["sections"])
        book = row["book"] if row["book"] != MISSING else "**missing**"
        if row["kind"] == "code":
            lines = row["post"].rstrip("\n").splitlines()
            first = next(line for line in lines if line.strip())
            more = f" … ({len(lines)} lines)" if len(lines) > 1 else ""
            out.append(f"| **{row['example']}**, code: {_code(first)}{more} | | {book}: {links} |")
        else:
            out.append(f"| {_code(row['post'])} | {_code(row['today'])} | {book} |")
    return "\n".join(out)


def post_rows(post: dict, sections: dict[str, Section]) -> list[dict]:
    """All rows of one post: its code run today, against the book's sections."""
    today = run_post(post)
    return [
        row
        for block, lines in zip(post["blocks"], today, strict=True)
        for row in block_rows(block, lines, sections, post.get("translate"))
    ]


def notes(posts: list[dict], post: str) -> str:
    """The notes on one post's blocks, as a Markdown list."""
    (blocks,) = [p["blocks"] for p in posts if p["post"] == post]
    items = [f"- {b['example']}: {b['note']}" for b in blocks if b.get("note")]
    return "\n".join(["Notes:", "", *items]) if items else ""


KINDS = ["same", "today's line", "the post's line", "both lines", MISSING]


def count(rows: list[dict]) -> dict[str, int]:
    printed = [row for row in rows if row["kind"] == "printed"]
    counts = {
        "code blocks": sum(row["kind"] == "code" for row in rows),
        "lines the post printed": sum(row["post"] is not None for row in printed),
        "lines printed today": sum(row["today"] is not None for row in printed),
    }
    counts.update({kind: sum(row["book"] == kind for row in printed) for kind in KINDS})
    return counts


def counts_table(counts: dict[str, dict[str, int]]) -> str:
    columns = list(next(iter(counts.values())))
    lines = ["| post | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for post, row in counts.items():
        lines.append(f"| {post} | " + " | ".join(str(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def in_first_chapters(section: Section) -> bool:
    """Chapters 1-4 and the errata: the sections this page asserts complete."""
    name = section.notebook.name
    return name == "errata.ipynb" or name[:2] in {"01", "02", "03", "04"}
