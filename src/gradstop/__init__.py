"""gradstop: the helper package of the book *Where Gradients Stop*.

The chapters import it as ``import gradstop as gp``. Read the modules in this
order; each is short:

``graph``
    one walk over autograd's backward graph (``backward_edges``) and what is
    read from it: ``grad_fn_names``, which tensors get a gradient, ``hooks_on``.
``pictures``
    ``backward_graph`` (torchviz, made byte-stable, with names, an orange
    ``highlight`` and red ``cut_after`` marks), ``side_by_side``, ``stacked``,
    ``plot_picture``; every picture has alt text and a caption.
``forward``
    the forward view: ``record()`` what ran, ``walk`` it into plain records,
    ``forward_view`` draws them with the cuts visible.
``diagnosis``
    ``why_no_grad(output, tensor)``: why a gradient is missing, as a reason
    code and one sentence, read from the graph (and from a recording);
    ``grad_report(loss, model)`` for every parameter; ``diagnose_step(model,
    optimizer)`` around your own training step; ``decision_tree()`` draws the
    rules they follow. A subpackage: facts, rules, sentences, report, picture.
``tables``
    ``print_table`` prints a table of results; ``grad_state`` says, for each named
    module or tensor, whether backward() left ``None``, zeros or a gradient.
``errors``
    ``show_error`` and ``assert_raises``: an error caught on purpose, with the
    message it must have (the book's error index reads it from the call).
``palette``
    the colours every picture and plot uses.
``simsiam_toy``
    chapter 6's SimSiam experiment on scikit-learn's digits (imported on its
    own: ``from gradstop import simsiam_toy``; it needs scikit-learn).
"""

from . import palette
from .diagnosis import Reason, decision_tree, diagnose_step, grad_report, why_no_grad
from .errors import assert_raises, show_error
from .forward import forward_view, record
from .graph import backward_edges, backward_nodes, grad_fn_names, hooks_on
from .pictures import backward_graph, plot_picture, side_by_side, stacked
from .tables import grad_state, print_table

# What the chapters use; the records and classes live in their modules
# (gradstop.forward.Value, gradstop.pictures.Picture, ...).
__all__ = [
    "Reason",
    "assert_raises",
    "backward_edges",
    "backward_graph",
    "backward_nodes",
    "decision_tree",
    "diagnose_step",
    "forward_view",
    "grad_report",
    "grad_fn_names",
    "grad_state",
    "hooks_on",
    "palette",
    "plot_picture",
    "print_table",
    "record",
    "show_error",
    "side_by_side",
    "stacked",
    "why_no_grad",
]
