"""Why is my gradient None? A diagnosis read from the graph itself, and from a recording.

``why_no_grad(output, tensor)`` answers with a ``Reason`` and one sentence: the
cause in PyTorch's terms and the fix. ``grad_report(loss, model)`` asks it about
every parameter of a model (and about tensors the model holds without registering
them). ``diagnose_step(model, optimizer)`` is the one call to put around your own
training step: it records the step and prints, for every parameter and every
tensor you name, the verdict and the fix. ``decision_tree()`` draws the rules.

The subpackage, in reading order:

``recorder``
    what a recording notes for the diagnosis besides the calls: backward passes,
    ``.grad`` reads, hooks, module hooks, the reader's line of each cut.
``recorded``
    what a recording says about one tensor: its uses, the cuts, the exits.
``facts``
    what the live objects say: dtype, ``requires_grad``, whether backward()
    reaches it, the hooks on the way; with the recorded trace, one ``Facts``.
``rules``
    the ``Reason`` codes and ``RULES``, one table of questions about the facts.
``sentences``
    one sentence per reason, filled in from the facts.
``report``
    ``why_no_grad``, ``grad_report``; ``names`` finds what to call each tensor.
``step``
    ``diagnose_step``, around a training step.
``picture``
    ``decision_tree()``, drawn from ``RULES``.

``why_no_grad`` never guesses: where the facts cannot settle the cause (a leaf
that backward() does not reach, without a recording; code inside torch.compile)
it answers ``Reason.UNDECIDED`` and says what would settle it.
"""

from . import recorder  # noqa: F401  (it hooks into gradstop.record())
from .facts import COMPILED_NODE, MODULE_HOOK_NODE, Facts, facts
from .picture import DecisionTree, decision_tree, describe_rules, draw_rules
from .recorded import COPY_OPS, Cut, Trace, trace
from .report import Diagnosis, GradReport, ParameterRow, diagnose, grad_report, why_no_grad
from .rules import CUT_REASONS, QUESTIONS, REACHED, RULES, Question, Reason, decide
from .sentences import SENTENCES, sentence
from .step import StepReport, diagnose_step

__all__ = [
    "COMPILED_NODE",
    "COPY_OPS",
    "CUT_REASONS",
    "MODULE_HOOK_NODE",
    "QUESTIONS",
    "REACHED",
    "RULES",
    "SENTENCES",
    "Cut",
    "DecisionTree",
    "Diagnosis",
    "Facts",
    "GradReport",
    "ParameterRow",
    "Question",
    "Reason",
    "StepReport",
    "Trace",
    "decide",
    "decision_tree",
    "describe_rules",
    "diagnose",
    "diagnose_step",
    "draw_rules",
    "facts",
    "grad_report",
    "sentence",
    "trace",
    "why_no_grad",
]
