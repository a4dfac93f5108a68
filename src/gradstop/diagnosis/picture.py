"""The decision tree, drawn from RULES: the picture cannot drift from the code.

It is drawn as an outline, top to bottom: each question is a box, and each of
its answers is a row below it, one step to the right, joined to it by an elbow
line; an answer says what it is ("no ▸") inside its own box, then the next
question or the reason it leads to. A reason reached from several questions is
drawn once per question. So no line crosses another and no label sits outside a
box, at any width: the SVG is laid out here, not by Graphviz.

A tree taller than ``PART_HEIGHT`` is shown in parts, one under the other, at one
width: a page shrinks a picture taller than a screen, and its labels with it. A line
that runs on from one part into the next leaves the bottom edge of the first and
enters the top of the next at the same place. ``svg`` keeps the whole tree as one.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass

from .. import palette
from ..pictures import Picture, check_alt, inline_code
from . import rules
from .rules import CUT_REASONS, REACHED, Reason

FONT = 12  # px, monospace
CHAR = 0.62 * FONT  # the widest common monospace advance, so text stays inside
ROW = 26  # px from one row to the next
BOX = 20  # px: a box's height
INDENT = 26  # px: one level of the outline
PAD = 6  # px of padding inside a box
PART_HEIGHT = 1100  # px: the tallest part shown (the book's pages shrink a picture over 1200)


@dataclass(frozen=True, repr=False)
class DecisionTree(Picture):
    """RULES as a picture, with what it shows as data (names, for assertions)."""

    reasons: frozenset[str] = frozenset()  # the Reason names drawn
    questions: frozenset[str] = frozenset()  # the question texts drawn
    parts: tuple[tuple[str, str], ...] = ()  # (SVG, alt text) of each part shown

    def __repr__(self) -> str:
        return f"DecisionTree({len(self.questions)} questions, {len(self.reasons)} reasons)"

    def _repr_html_(self) -> str:
        if len(self.parts) < 2:
            return super()._repr_html_()
        images = "".join(
            f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()}" '
            f'alt="{html.escape(alt)}" style="display:block;background:#fff;max-width:100%;'
            'height:auto;padding:0 4px;margin:0">'
            for svg, alt in self.parts
        )
        caption = f"<figcaption>{inline_code(self.caption)}</figcaption>" if self.caption else ""
        return f'<figure class="gradient-graph decision-tree">{images}{caption}</figure>'


@dataclass(frozen=True)
class _Row:
    depth: int
    parent: int | None  # the row of the question this answers (None: the first question)
    answer: str  # "" for the first question
    question: str = ""  # a question's text, or
    reason: Reason | None = None  # the reason an answer leads to


def outline() -> list[_Row]:
    """RULES depth-first: after each question, its answers that end in a reason, then
    the ones that lead to further questions (so each branch reads to its end)."""
    questions = {q.key: q for q in rules.RULES}
    rows: list[_Row] = []

    def visit(key: str, depth: int, parent: int | None, answer: str) -> None:
        question = questions[key]
        rows.append(_Row(depth, parent, answer, question=question.text))
        me = len(rows) - 1
        ends = [(a, s) for a, s in question.branches.items() if isinstance(s, Reason)]
        for said, reason in ends:
            rows.append(_Row(depth + 1, me, said, reason=reason))
        for said, step in question.branches.items():
            if not isinstance(step, Reason):
                visit(step, depth + 1, me, said)

    visit(rules.RULES[0].key, 0, None, "")
    return rows


def _style(reason: Reason | None) -> tuple[str, str, str]:
    """(fill, outline, text colour) of a box."""
    if reason is None:
        return "white", "black", "black"
    if reason in REACHED:
        return palette.BLUE_FILL, palette.BLUE, "black"
    if reason in CUT_REASONS.values() or reason is Reason.LEFT_TORCH:
        return "white", palette.RED, palette.RED
    return palette.GREY_FILL, palette.GREY, "black"


def _parts(row: _Row) -> list[tuple[str, str]]:
    """The box's text as (text, font weight) pieces."""
    said = [(f"{row.answer} ▸ ", "normal")] if row.answer else []
    if row.reason is None:
        return [*said, (row.question, "normal")]
    return [*said, (row.reason.name, "bold"), (f"  {row.reason.value}", "normal")]


def _box(i: int, row: _Row) -> str:
    x, y = row.depth * INDENT + 2, i * ROW + 2
    parts = _parts(row)
    width = sum(len(text) for text, _ in parts) * CHAR + 2 * PAD
    fill, line, ink = _style(row.reason)
    rounded = 8 if row.reason is None else 2
    spans = "".join(
        f'<tspan font-weight="{weight}">{html.escape(text)}</tspan>' for text, weight in parts
    )
    return (
        f'<rect x="{x}" y="{y}" width="{width:.0f}" height="{BOX}" rx="{rounded}" '
        f'fill="{fill}" stroke="{line}"/>'
        f'<text x="{x + PAD}" y="{y + BOX - 6}" fill="{ink}" xml:space="preserve">{spans}</text>'
    )


def _elbow(i: int, row: _Row, rows: list[_Row]) -> str:
    """The line from the parent question's box down, then right, to this row's box."""
    parent = rows[row.parent]
    x0 = parent.depth * INDENT + 2 + INDENT / 2
    y0 = row.parent * ROW + 2 + BOX
    x1, y1 = row.depth * INDENT + 2, i * ROW + 2 + BOX / 2
    return f'<path d="M{x0:.0f},{y0} V{y1:.0f} H{x1}" fill="none" stroke="{palette.GREY_LINE}"/>'


def _width(rows: list[_Row]) -> float:
    return max(r.depth * INDENT + sum(len(t) for t, _ in _parts(r)) * CHAR for r in rows)


def _svg(rows: list[_Row], start: int, stop: int, width: float) -> str:
    """Rows start to stop - 1 of the outline as one SVG, the width of the whole tree.
    Lines from a question above ``start`` come in at the top edge; lines to answers at
    or below ``stop`` go out at the bottom edge."""
    top = start * ROW
    height = (stop - start) * ROW + 4
    lines, boxes = [], []
    for i, row in enumerate(rows):
        if row.parent is None or row.parent >= stop or i < start:
            continue
        path = _elbow(i, row, rows)  # in the whole tree's coordinates
        lines.append(path)
    for i in range(start, stop):
        boxes.append(_box(i, rows[i]))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 2 * PAD + 6:.0f}" '
        f'height="{height}" font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" '
        f'font-size="{FONT}"><rect width="100%" height="100%" fill="white"/>'
        f'<g transform="translate(0 {-top})">' + "".join(lines + boxes) + "</g></svg>"
    )


def draw_rules() -> tuple[str, set[Reason]]:
    """RULES as SVG text, an outline read top to bottom; and the reasons it drew."""
    rows = outline()
    svg = _svg(rows, 0, len(rows), _width(rows))
    return svg, {r.reason for r in rows if r.reason is not None}


def split_points(rows: int, part_rows: int) -> list[int]:
    """Where the parts start: as few parts as fit ``part_rows`` rows each, of equal size."""
    if part_rows < 1:
        raise ValueError(f"a part must hold at least one row, not {part_rows}")
    count = max(1, math.ceil(rows / part_rows))
    return [round(k * rows / count) for k in range(count)] + [rows]


def draw_parts() -> list[tuple[str, list[_Row]]]:
    """The tree cut into parts no taller than PART_HEIGHT: (SVG, the part's rows) each."""
    rows = outline()
    width = _width(rows)
    bounds = split_points(len(rows), (PART_HEIGHT - 4) // ROW)
    return [
        (_svg(rows, start, stop, width), rows[start:stop])
        for start, stop in zip(bounds, bounds[1:], strict=False)
    ]


def describe_rules() -> str:
    """RULES in words: the figure's alt text."""
    questions = {q.key: q for q in rules.RULES}
    parts = [f"Decision tree of why_no_grad, read top to bottom, from '{rules.RULES[0].text}'."]
    for question in rules.RULES:
        answers = "; ".join(
            f"{answer}: " + (step.name if isinstance(step, Reason) else f"'{questions[step].text}'")
            for answer, step in question.branches.items()
        )
        parts.append(f"'{question.text}' {answers}.")
    return " ".join(parts)


def _part_alt(n: int, count: int, rows: list[_Row]) -> str:
    """A later part's alt text: which part it is and the questions it shows."""
    shown = "; ".join(r.question for r in rows if r.reason is None) or "answers only"
    return f"Decision tree of why_no_grad, part {n} of {count}, continued from above: {shown}."


def decision_tree(*, alt: str | None = None, caption: str | None = None) -> DecisionTree:
    """The picture of RULES; the alt text, unless given, is RULES in words (on the first
    part, where the tree is shown in parts)."""
    drawn_svg, drawn = draw_rules()
    whole_alt = describe_rules() if alt is None else check_alt(alt)
    drawn_parts = draw_parts()
    parts = tuple(
        (svg, whole_alt if n == 1 else _part_alt(n, len(drawn_parts), rows))
        for n, (svg, rows) in enumerate(drawn_parts, 1)
    )
    return DecisionTree(
        svg=drawn_svg,
        alt=whole_alt,
        caption=caption,
        reasons=frozenset(r.name for r in drawn),
        questions=frozenset(q.text for q in rules.RULES),
        parts=parts,
    )
