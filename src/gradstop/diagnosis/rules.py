"""The rules: one table of questions about the facts, read by why_no_grad and by the figure.

``RULES`` is a tree of ``Question``s. ``decide`` starts at the first one, asks
each question of the ``Facts`` and follows the answer to the next question or
to a ``Reason``. ``decision_tree()`` (``picture``) draws the same table, so the
picture cannot drift from the code.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from .facts import Facts


class Reason(enum.Enum):
    """Why ``tensor.grad`` is what it is; the value says it in PyTorch's terms."""

    OK = "reached; .grad holds the gradient"
    NOT_YET = "reached; no backward() has filled .grad yet"
    HOOKED = "reached through hooks that change it"
    PARTIAL = "reached, but another path is cut"
    NOT_ACCUMULATED = "reached; this backward call fills no .grad for it"
    UNREGISTERED = "reached; not a registered parameter"
    NON_LEAF = "not a leaf: .grad is not kept"
    NOT_FLOAT = "an integer dtype: no gradient"
    NO_REQUIRES_GRAD = "requires_grad is False"
    SWITCHED_OFF = "requires_grad switched off after the forward"
    LATE_REQUIRES_GRAD = "requires_grad set after the forward"
    DETACHED = "cut by detach()"
    DATA = "cut by .data"
    NO_GRAD = "computed under no_grad()"
    CHECKPOINTED = "cut by a reentrant checkpoint"
    COPIED = "copied without its graph"
    NOT_DIFFERENTIABLE = "no gradient through it"
    LEFT_TORCH = "left PyTorch (item(), numpy())"
    RECOMPUTED = "a fresh value, recomputed on each read"
    UNUSED = "not used by the output"
    NOT_ON_PATH = "used, but not on the output's path"
    UNDECIDED = "cannot tell from what it sees"


# The reasons for which backward() from the output does reach the tensor.
REACHED = frozenset(
    {
        Reason.OK,
        Reason.NOT_YET,
        Reason.HOOKED,
        Reason.PARTIAL,
        Reason.NOT_ACCUMULATED,
        Reason.UNREGISTERED,
        Reason.NON_LEAF,
    }
)


@dataclass(frozen=True)
class Question:
    """One question about the facts; each answer leads to a question (key) or a Reason."""

    key: str
    text: str  # as the figure shows it
    answer: Callable[[Facts], str]
    branches: dict[str, str | Reason]


def yes(value: bool) -> str:
    return "yes" if value else "no"


# Which Reason each kind of cut leads to (a Cut's kind is one of these keys).
CUT_REASONS = {
    "detach": Reason.DETACHED,
    "data": Reason.DATA,
    "no_grad": Reason.NO_GRAD,
    "checkpoint": Reason.CHECKPOINTED,
    "copy": Reason.COPIED,
    "integer result": Reason.NOT_DIFFERENTIABLE,
    "no derivative": Reason.NOT_DIFFERENTIABLE,
    "custom Function": Reason.NOT_DIFFERENTIABLE,
    "autograd.grad": Reason.NOT_DIFFERENTIABLE,
}


def _path_answer(f: Facts) -> str:
    if f.trace.unseen:
        return "an unrecorded change"
    if f.cut is not None:
        return "a cut"
    if f.trace.exits:
        return "left PyTorch"
    return "an uncut path" if f.trace.reaches_output else "no path"


def _fills(f: Facts) -> str:
    """Did a recorded backward pass from the output fill this tensor's .grad?"""
    if f.trace is None or f.trace.fills is None or f.trace.fills:
        return "yes, or not recorded"
    return "no"


RULES: tuple[Question, ...] = (
    Question(
        "dtype",
        "floating-point or complex dtype?",
        lambda f: yes(f.dtype.is_floating_point or f.dtype.is_complex),
        {"yes": "requires", "no": Reason.NOT_FLOAT},
    ),
    Question(
        "requires",
        "tensor.requires_grad?",
        lambda f: yes(f.requires_grad),
        {"yes": "reached", "no": "switched"},
    ),
    Question(
        "switched",
        "its AccumulateGrad in output's graph?",
        lambda f: yes(f.in_graph),
        {"yes": Reason.SWITCHED_OFF, "no": "made"},
    ),
    Question(
        "made",
        "recorded: made by a cut?",
        lambda f: "yes" if f.cut else "no, or not recorded",
        {"yes": "made_kind", "no, or not recorded": Reason.NO_REQUIRES_GRAD},
    ),
    Question("made_kind", "which operation made it?", lambda f: f.cut.kind, CUT_REASONS),
    Question(
        "reached",
        "backward() from output reaches it?",
        lambda f: yes(f.reached),
        {"yes": "keeps", "no": "fresh"},
    ),
    Question(
        "fresh",
        "made afresh from leaves it reaches?",
        lambda f: yes(bool(f.fresh_of)),
        {"yes": Reason.RECOMPUTED, "no": "compiled"},
    ),
    Question(
        "compiled",
        "torch.compile'd code in output's graph?",
        lambda f: yes(f.compiled),
        {"yes": Reason.UNDECIDED, "no": "recorded"},
    ),
    Question(
        "recorded",
        "forward pass recorded?",
        lambda f: yes(f.trace is not None),
        {"yes": "used", "no": Reason.UNDECIDED},
    ),
    Question(
        "used",
        "recorded: used by an operation?",
        lambda f: yes(f.trace.used),
        {"yes": "late", "no": Reason.UNUSED},
    ),
    Question(
        "late",
        "recorded: required grad when used?",
        lambda f: yes(f.trace.used_with_grad),
        {"yes": "cut", "no": Reason.LATE_REQUIRES_GRAD},
    ),
    Question(
        "cut",
        "recorded: what stops the path to output?",
        _path_answer,
        {
            "a cut": "kind",
            "left PyTorch": Reason.LEFT_TORCH,
            "no path": Reason.NOT_ON_PATH,
            "an uncut path": Reason.UNDECIDED,
            "an unrecorded change": Reason.UNDECIDED,
        },
    ),
    Question("kind", "which operation cut it?", lambda f: f.cut.kind, CUT_REASONS),
    Question(
        "keeps",
        "a leaf, or retain_grad() called?",
        lambda f: yes(f.is_leaf or f.retains_grad),
        {"yes": "fills", "no": Reason.NON_LEAF},
    ),
    Question(
        "fills",
        "recorded: the backward call fills its .grad?",
        _fills,
        {"yes, or not recorded": "through_compiled", "no": Reason.NOT_ACCUMULATED},
    ),
    Question(
        "through_compiled",
        "through torch.compile'd code?",
        lambda f: yes(f.compiled),
        {"yes": "compiled_filled", "no": "partial"},
    ),
    Question(
        "compiled_filled",
        "tensor.grad holds a tensor? (compiled)",
        lambda f: yes(f.grad is not None),
        {"yes": Reason.OK, "no": Reason.UNDECIDED},
    ),
    Question(
        "partial",
        "recorded: another path from it cut?",
        lambda f: yes(bool(f.trace and (f.trace.lost or f.trace.round_trip))),
        {"yes": Reason.PARTIAL, "no": "registered"},
    ),
    Question(
        "filled",
        "tensor.grad holds a tensor?",
        lambda f: yes(f.grad is not None),
        {"yes": "hooks", "no": "returned_none"},
    ),
    Question(
        "returned_none",
        "recorded: a custom Function's backward left it None?",
        lambda f: yes(bool(f.cut and f.cut.kind == "custom backward")),
        {"yes": Reason.NOT_DIFFERENTIABLE, "no": Reason.NOT_YET},
    ),
    Question(
        "hooks",
        "hooks on the path that change it?",
        lambda f: yes(bool(f.hooks)),
        {"yes": Reason.HOOKED, "no": Reason.OK},
    ),
    Question(
        "registered",
        "a registered parameter? (grad_report)",
        lambda f: "no" if f.registered is False else "yes, or not asked",
        {"yes, or not asked": "filled", "no": Reason.UNREGISTERED},
    ),
)
QUESTIONS = {q.key: q for q in RULES}


def decide(f: Facts) -> tuple[Reason, tuple[str, ...]]:
    """Follow RULES from the first question: the Reason, and each question with its answer."""
    question, trail = RULES[0], []
    while True:
        answer = question.answer(f)
        trail.append(f"{question.text} {answer}")
        step = question.branches[answer]
        if isinstance(step, Reason):
            return step, tuple(trail)
        question = QUESTIONS[step]
