"""The decision tree, drawn from RULES: the picture cannot drift from the code.

Every question is a box; an answer that leads to a reason puts that reason's box
right beside the question; a question whose answers are all reasons is one
small table. A reason reached from several questions is drawn once per
question, so the picture is a tree and no edge crosses another.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

import graphviz

from .. import palette
from ..pictures import Picture, check_alt, svg
from . import rules
from .rules import CUT_REASONS, REACHED, Question, Reason

# Labels in the decision tree wrap at this many characters.
WRAP = 18


@dataclass(frozen=True, repr=False)
class DecisionTree(Picture):
    """RULES as a picture, with what it shows as data (names, for assertions)."""

    reasons: frozenset[str] = frozenset()  # the Reason names drawn
    questions: frozenset[str] = frozenset()  # the question texts drawn

    def __repr__(self) -> str:
        return f"DecisionTree({len(self.questions)} questions, {len(self.reasons)} reasons)"


def _reason_style(reason: Reason) -> dict[str, str]:
    if reason in REACHED:
        return {"fillcolor": palette.BLUE_FILL, "color": palette.BLUE}
    if reason in CUT_REASONS.values() or reason is Reason.LEFT_TORCH:
        return {"fillcolor": "white", "color": palette.RED, "fontcolor": palette.RED}
    return {"fillcolor": palette.GREY_FILL, "color": palette.GREY}


def _wrap(text: str) -> str:
    return textwrap.fill(text, WRAP, break_long_words=False, break_on_hyphens=False)


def _graph() -> graphviz.Digraph:
    return graphviz.Digraph(
        graph_attr={"bgcolor": "white", "rankdir": "TB", "nodesep": "0.25", "ranksep": "0.3"},
        node_attr={"fontname": "monospace", "fontsize": "10", "margin": "0.12,0.06"},
        edge_attr={"fontname": "monospace", "fontsize": "9", "color": palette.GREY_LINE},
    )


def draw_rules() -> tuple[graphviz.Digraph, set[Reason]]:
    """RULES as a Graphviz tree, top to bottom; and the reasons it drew."""
    dot, drawn = _graph(), set()
    questions = {q.key: q for q in rules.RULES}
    stack = [(rules.RULES[0], rules.RULES[0].key)]
    while stack:
        question, node = stack.pop()
        steps = list(question.branches.values())
        drawn.update(step for step in steps if isinstance(step, Reason))
        if len(steps) > 2 and all(isinstance(step, Reason) for step in steps):
            dot.node(node, _table_label(question), shape="plain")
            continue
        dot.node(node, _wrap(question.text), shape="box", style="rounded")
        for answer, step in question.branches.items():
            child = f"{node}/{answer}"
            if isinstance(step, Reason):
                _reason_beside(dot, node, child, answer, step)
            else:
                dot.edge(node, child, label=f" {answer} ")
                stack.append((questions[step], child))
    return dot, drawn


def _reason_beside(dot: graphviz.Digraph, node: str, child: str, answer: str, reason: Reason):
    """A reason's box on the question's own rank, joined by a short labelled edge."""
    label = f"{reason.name}\n{_wrap(reason.value)}"
    dot.node(child, label, shape="box", style="filled", **_reason_style(reason))
    dot.edge(node, child, label=f" {answer} ", minlen="1")
    with dot.subgraph() as beside:
        beside.attr(rank="same")
        beside.node(node)
        beside.node(child)


def _table_label(question: Question) -> str:
    """A question and its answers as one Graphviz HTML-like table."""
    rows = "".join(
        f'<TR><TD ALIGN="RIGHT">{html.escape(answer)}</TD><TD ALIGN="LEFT">'
        f'<FONT COLOR="{_reason_style(step)["color"]}">{step.name}</FONT></TD></TR>'
        for answer, step in question.branches.items()
    )
    head = f'<TR><TD COLSPAN="2">{html.escape(question.text)}</TD></TR>'
    table = '<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" STYLE="ROUNDED">'
    return f"<{table}{head}{rows}</TABLE>>"


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


def decision_tree(*, alt: str | None = None, caption: str | None = None) -> DecisionTree:
    """The picture of RULES; the alt text, unless given, is RULES in words."""
    dot, drawn = draw_rules()
    return DecisionTree(
        svg=svg(dot.source),
        alt=describe_rules() if alt is None else check_alt(alt),
        caption=caption,
        reasons=frozenset(r.name for r in drawn),
        questions=frozenset(q.text for q in rules.RULES),
    )
