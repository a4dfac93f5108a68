"""Pictures for the chapters: backward graphs, pairs of pictures, plots.

``backward_graph(out, alt=...)``
    torchviz's picture of the backward graph behind ``out``, made byte-stable:
    torchviz names each node by the Python ``id()`` of its object, so the same
    computation gives a different DOT file on every run; here nodes are renamed
    ``n0, n1, ...`` in the order torchviz first visits them. The output's box
    carries its name, a named computed tensor names the node that made it, and
    shapes read ``(3,)`` as in the forward view. ``cut_edges`` draws chosen edges
    red and dashed, as the forward view draws a cut: the edges a ``detach()``
    would remove.
    ``highlight=t`` draws the chain behind a tensor in orange, and
    ``cut_after={"h.detach()": h}`` marks where a detach of ``h`` would cut.
``side_by_side(before, after, caption=..., same_scale=False)``
    two pictures as one figure, each with its own caption; ``same_scale=True``
    shows both at one scale, so that the sizes of the two graphs compare.
``stacked(first, second, ..., caption=...)``
    pictures one under the other, at one scale, so that each keeps the page's
    width and its labels their size.
``plot_picture(fig, alt=...)``
    a matplotlib figure as the same kind of picture: SVG, alt text, caption,
    byte-stable from run to run, shrunk to the text column's width if wider, its
    fonts keeping their size.

Every picture carries alt text and renders as an HTML ``<figure>`` with the SVG
inlined, so the alt text and caption reach the built book unchanged. Hooks are
invisible to torchviz; a purple note marks each named tensor that has some.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import re
import sys
from dataclasses import dataclass, field

import graphviz
import torch
import torchviz

from . import palette
from .graph import backward_edges, backward_nodes, hooks_on

# A node line is "\t<name> [attrs]"; an edge line is "\t<name> -> <name> [attrs]".
# torchviz's names are id()s, all digits; the names this module adds are not.
_NODE_LINE = re.compile(r"^\t(\w+)( \[)")
_EDGE_LINE = re.compile(r"^\t(\w+) -> (\w+)\b")
# torchviz writes a tensor's shape on a line of its own as " (3)"; the book
# writes Python's "(3,)".
_TORCHVIZ_SHAPE = re.compile(r"\n \(([\d, ]*)\)")
_FREED = "after they have already been freed"
_SVG_WIDTH = re.compile(r'<svg[^>]*\swidth="([\d.]+)pt"')


def inline_code(text: str) -> str:
    """Escape ``text`` for HTML, turning `backticked` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def check_alt(alt: object) -> str:
    """The alt text, stripped; a clear error when there is none."""
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(
            "alt text is required: describe in words what the picture shows, "
            "e.g. alt='x feeds AddBackward0, then MulBackward0, then MeanBackward0'"
        )
    return alt.strip()


def check_output(output: object) -> torch.Tensor:
    """``output``, if it is a tensor with an autograd graph to draw."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"expected the tensor whose graph to draw, got {type(output).__name__}; "
            "pass the result of a computation, e.g. backward_graph(loss, alt=...)"
        )
    if output.grad_fn is None and not output.requires_grad:
        raise ValueError(
            "this tensor has no autograd graph (requires_grad is False and grad_fn is None): "
            "it was made without requires_grad=True on its inputs, under torch.no_grad(), "
            "or by detach(). Draw a tensor computed from inputs that require grad."
        )
    return output


def shape_text(shape) -> str:
    """A shape as every picture writes it: ``(2, 3)``, ``(3,)``, ``()``."""
    return str(tuple(shape))


def svg(dot_source: str) -> str:
    """Render DOT source to SVG text with Graphviz's ``dot``."""
    return graphviz.Source(dot_source).pipe(format="svg", encoding="utf-8")


def hook_note(dot: graphviz.Digraph, key: str, target: str, label: str) -> None:
    """A purple note ``label`` attached to node ``target``."""
    dot.node(
        key,
        label,
        shape="note",
        style="filled",
        fillcolor=palette.PURPLE_FILL,
        color=palette.PURPLE,
        fontcolor=palette.PURPLE,
    )
    dot.edge(key, target, style="dashed", color=palette.PURPLE, arrowhead="none")


@dataclass(frozen=True)
class Picture:
    """An SVG with its alt text and an optional caption; shows itself as HTML."""

    svg: str = field(repr=False)  # long; the HTML view shows it
    alt: str = ""
    caption: str | None = None

    @property
    def width_pt(self) -> float:
        """The picture's own width in points, as its SVG declares it."""
        found = _SVG_WIDTH.search(self.svg)
        return float(found.group(1)) if found else 0.0

    def img_html(self, max_width: str = "100%", fill: bool = False) -> str:
        """The picture as an <img>; ``fill`` stretches it to its container's width."""
        data = base64.b64encode(self.svg.encode("utf-8")).decode("ascii")
        width = "width:100%;box-sizing:border-box;" if fill else ""
        # The white background keeps black graph lines readable in dark mode.
        return (
            f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(self.alt)}" '
            f'style="background:#fff;{width}max-width:{max_width};height:auto;padding:4px">'
        )

    def _repr_html_(self) -> str:
        caption = f"<figcaption>{inline_code(self.caption)}</figcaption>" if self.caption else ""
        return f'<figure class="gradient-graph">{self.img_html()}{caption}</figure>'


def svg_width(svg_text: str) -> float:
    """The width of an SVG picture, in points, as Graphviz and matplotlib write it."""
    found = _SVG_WIDTH.search(svg_text)
    if found is None:
        raise ValueError('this SVG has no width in points (width="...pt") to scale by')
    return float(found.group(1))


@dataclass(frozen=True)
class SideBySide:
    """Two pictures side by side, each with its caption, plus one overall caption.

    With ``same_scale``, each picture's share of the row is its own width, so both
    are shrunk (or grown) by the same factor: one point is as long in each.
    """

    left: Picture
    right: Picture
    caption: str
    same_scale: bool = False

    def _repr_html_(self) -> str:
        pics = (self.left, self.right)
        grow = [svg_width(p.svg) if self.same_scale else 1 for p in pics]
        cells = "".join(
            f'<figure style="margin:0;flex:{g:g} 1 0;min-width:14em">'
            f"{p.img_html(fill=self.same_scale)}"
            f"<figcaption>{inline_code(p.caption or '')}</figcaption></figure>"
            for p, g in zip(pics, grow, strict=True)
        )
        # at one scale, no wider than both at their natural size (never blown up)
        widest = f";max-width:calc({sum(grow):g}pt + 1.5em)" if self.same_scale else ""
        return (
            '<figure class="gradient-graph-pair">'
            f'<div style="display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start{widest}">'
            f"{cells}</div>"
            f"<figcaption>{inline_code(self.caption)}</figcaption></figure>"
        )


def side_by_side(
    before: Picture, after: Picture, *, caption: str, same_scale: bool = False
) -> SideBySide:
    """Show two pictures as one figure: ``before`` on the left, ``after`` on the right."""
    for side, pic in (("before", before), ("after", after)):
        if not isinstance(pic, Picture):
            raise TypeError(
                f"{side} must be a Picture (from backward_graph), got {type(pic).__name__}"
            )
        if not pic.caption:
            raise ValueError(f"{side} needs its own caption, e.g. 'without detach'")
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("the pair needs a caption saying what changed between the two graphs")
    return SideBySide(before, after, caption, same_scale)


@dataclass(frozen=True)
class Stack:
    """Pictures one under the other, each with its caption, plus one overall caption.

    They share one scale: where the widest must shrink to fit the page, every
    other shrinks by the same factor, so that equal boxes stay equal.
    """

    pictures: tuple[Picture, ...]
    caption: str

    def _repr_html_(self) -> str:
        widest = max(p.width_pt for p in self.pictures) or 1.0
        rows = "".join(
            '<figure style="margin:0 0 1em 0">'
            f"{p.img_html(max_width=f'{100 * p.width_pt / widest:.1f}%')}"
            f"<figcaption>{inline_code(p.caption or '')}</figcaption></figure>"
            for p in self.pictures
        )
        caption = f"<figcaption>{inline_code(self.caption)}</figcaption>"
        return f'<figure class="gradient-graph-stack">{rows}{caption}</figure>'


def stacked(*pictures: Picture, caption: str) -> Stack:
    """Show pictures as one figure, one under the other, at one scale."""
    if len(pictures) < 2:
        raise ValueError("stacked needs at least two pictures; show a single one as it is")
    for n, pic in enumerate(pictures, 1):
        if not isinstance(pic, Picture):
            raise TypeError(f"picture {n} must be a Picture, got {type(pic).__name__}")
        if not pic.caption:
            raise ValueError(f"picture {n} needs its own caption, e.g. 'without detach'")
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("the figure needs a caption saying what changed between the pictures")
    return Stack(tuple(pictures), caption)


# The book's text column is 680 CSS px wide at the browser tests' window (1300 px). A
# wider SVG is shrunk to it, and its labels with it: a 7-point legend in a 9-inch figure
# lands at 7.4 px. Drawn at most this wide, a figure keeps its fonts' sizes (points,
# 96/72 px each), so a font of 8 points or more stays above 10 px.
COLUMN_INCHES = 6.8


def fit_to_column(fig) -> None:
    """Shrink ``fig`` to the column's width, keeping its shape and its fonts' sizes."""
    width, height = fig.get_size_inches()
    if width <= COLUMN_INCHES:
        return
    fig.set_size_inches(COLUMN_INCHES, height * COLUMN_INCHES / width)
    if fig.get_layout_engine() is None:
        fig.tight_layout()  # the axes, not the fonts, give up the room


def plot_picture(fig, *, alt: str, caption: str | None = None) -> Picture:
    """A matplotlib figure as a Picture (the figure is closed, so it shows only once)."""
    import matplotlib.pyplot as plt

    if not hasattr(fig, "savefig"):
        raise TypeError(f"expected a matplotlib Figure, got {type(fig).__name__}")
    alt = check_alt(alt)
    fit_to_column(fig)
    buffer = io.StringIO()
    # A fixed salt and no date: the same figure gives the same bytes on every run.
    with plt.rc_context({"svg.hashsalt": "where-gradients-stop", "svg.fonttype": "path"}):
        fig.savefig(
            buffer, format="svg", metadata={"Date": None}, bbox_inches="tight", facecolor="white"
        )
    plt.close(fig)
    return Picture(svg=buffer.getvalue(), alt=alt, caption=caption)


# ---------------------------------------------------------------------------
# The backward graph: torchviz draws it; we name what it leaves unnamed.


@dataclass(frozen=True, repr=False)
class BackwardPicture(Picture):
    """A backward graph, with what its marks show as data (for the chapters' checks)."""

    highlighted: tuple[str, ...] = ()  # sorted type names of the orange nodes
    cuts: frozenset[tuple[str, str]] = frozenset()  # (cut label, type of the node after it)

    def __repr__(self) -> str:
        return f"BackwardPicture(highlighted={list(self.highlighted)}, cuts={sorted(self.cuts)})"


def backward_graph(
    output: torch.Tensor,
    *,
    alt: str,
    caption: str | None = None,
    names: dict[str, torch.Tensor] | None = None,
    show_saved: bool = False,
    highlight: torch.Tensor | None = None,
    cut_after: dict[str, torch.Tensor] | None = None,
    cut_edges=(),
    cut_label: str = "",
) -> BackwardPicture:
    """torchviz's backward graph of ``output`` as a byte-stable SVG picture.

    ``names`` maps labels to tensors: a leaf's box shows its label, and a
    computed tensor's label goes on the backward node that made it
    (``{"z1 = f(x1)": z1}``). The output's box shows its name from ``names``,
    else the caller's variable name for it, else "output". ``show_saved=True``
    also draws the tensors each node saved for backward; after ``backward()``
    has freed them this raises ``ValueError`` saying so. ``highlight=t`` fills
    the nodes behind ``t`` (leaves aside) in orange; ``cut_after={"h.detach()": h}``
    draws each edge out of ``h``'s node as a red dashed cut with that label.
    ``cut_edges`` (edges of this graph, from ``backward_edges(output)``) are drawn
    the same way, with ``cut_label`` beside each.
    """
    output, alt, names = check_output(output), check_alt(alt), _checked_names(names)
    cut_after = _checked_names(cut_after)
    output_name = _output_name(output, names, sys._getframe(1))
    labels = {output_name: output, **{k: v for k, v in names.items() if v is not output}}
    drawn = backward_nodes(output)
    with _recursion_room(len(drawn)):
        dot = _make_dot(output, labels, show_saved)
    for label, tensor in names.items():
        _name_node(dot, drawn, label, tensor, is_output=tensor is output)
    orange = _highlight(dot, drawn, highlight)
    cuts = {cut for label, t in cut_after.items() for cut in _mark_cut(dot, drawn, label, t)}
    _draw_cuts(dot, output, cut_edges, cut_label)
    dot.graph_attr.update(bgcolor="white")
    source = _stable_source(dot)
    return BackwardPicture(svg(source), alt, caption, orange, frozenset(cuts))


def _highlight(dot, drawn: set, tensor: torch.Tensor | None) -> tuple[str, ...]:
    """Fill the drawn nodes behind ``tensor`` in orange; their sorted type names."""
    if tensor is None:
        return ()
    if not isinstance(tensor, torch.Tensor) or tensor.grad_fn is None:
        raise ValueError("highlight takes a computed tensor of the graph (one with a grad_fn)")
    chain = [n for n in backward_nodes(tensor) & drawn if not hasattr(n, "variable")]
    for node in chain:
        dot.node(str(id(node)), fillcolor=palette.ORANGE_FILL, color=palette.ORANGE, penwidth="2")
    return tuple(sorted(type(node).__name__ for node in chain))


def _mark_cut(dot, drawn: set, label: str, tensor: torch.Tensor) -> list[tuple[str, str]]:
    """Redraw each edge from ``tensor``'s node to a node that used it as a red dashed cut."""
    node = tensor.grad_fn
    if node is None or node not in drawn:
        raise ValueError(f"cut_after[{label!r}]: that tensor's node is not in this graph")
    users = [n for n in drawn if (node, tensor.output_nr) in (n.next_functions or ())]
    edge = re.compile(rf"^\t{id(node)} -> ({'|'.join(str(id(u)) for u in users)})$")
    style = f' [color="{palette.RED}" fontcolor="{palette.RED}" style=dashed penwidth=2'
    style += " fontname=monospace fontsize=10"
    dot.body = [
        line.rstrip("\n") + style + f' label="✂ {label}"]\n'
        if edge.match(line.rstrip("\n"))
        else line
        for line in dot.body
    ]
    return [(label, type(u).__name__) for u in users]


def _checked_names(names) -> dict[str, torch.Tensor]:
    names = dict(names or {})
    bad = [k for k, v in names.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"names must map labels to tensors; not tensors: {bad}")
    return names


def _output_name(output: torch.Tensor, names: dict, caller) -> str:
    """The output's label: from ``names``, else the caller's one variable holding it."""
    given = [k for k, v in names.items() if v is output]
    if given:
        return given[0]
    bound = [k for k, v in caller.f_locals.items() if v is output and _is_variable(k)]
    return bound[0] if len(bound) == 1 else "output"


def _is_variable(name: str) -> bool:
    # Not IPython's _, _5 (output history), nor names tools make up (pytest's @py_...).
    return name.isidentifier() and not name.startswith("_")


def _make_dot(output, labels, show_saved) -> graphviz.Digraph:
    try:
        return torchviz.make_dot(output, params=labels, show_saved=show_saved)
    except RuntimeError as err:
        if _FREED not in str(err):
            raise
        raise ValueError(
            "backward() has already freed the tensors this graph saved, so they cannot be "
            "drawn: draw before backward(), call backward(retain_graph=True), "
            "or draw with show_saved=False"
        ) from None


def _name_node(dot, drawn: set, label: str, tensor: torch.Tensor, *, is_output: bool) -> None:
    """Put ``label`` on the node that made a computed tensor; mark the tensor's hooks.

    A leaf's box and the output's box already carry their labels (torchviz).
    A DOT node statement repeated later updates the node, so the label is added
    by declaring the node again.
    """
    node = tensor.grad_fn
    if node is not None and node not in drawn:
        return  # not part of this graph
    if node is not None and not is_output:
        dot.node(str(id(node)), f"{type(node).__name__}\n{label}")
    hooks = hooks_on(tensor)
    if hooks:
        # A hook on a leaf sits on the leaf's box; on a computed tensor, beside its node.
        target = id(tensor) if node is None else id(node)
        note = f"on {label}:\n" + "\n".join(hooks)
        hook_note(dot, f"hook_{len(dot.body)}", str(target), note)


@contextlib.contextmanager
def _recursion_room(frames: int):
    # torchviz walks the graph recursively, one Python frame per node.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, old + 2 * frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _stable_source(dot: graphviz.Digraph) -> str:
    """DOT source with torchviz's id()-based node names replaced by n0, n1, ...

    and torchviz's shapes, ``(3)``, written as the book writes them, ``(3,)``.
    """
    names: dict[str, str] = {}

    def rename(raw: str) -> str:
        return names.setdefault(raw, f"n{len(names)}") if raw.isdigit() else raw

    body = []
    for line in dot.body:
        edge = _EDGE_LINE.match(line)
        node = _NODE_LINE.match(line)
        if edge:
            line = f"\t{rename(edge.group(1))} -> {rename(edge.group(2))}{line[edge.end() :]}"
        elif node:
            line = f"\t{rename(node.group(1))}{line[node.start(2) :]}"
        body.append(_TORCHVIZ_SHAPE.sub(_book_shape, line))
    stable = dot.copy()
    stable.body = body
    return stable.source


def _book_shape(match: re.Match) -> str:
    sizes = [int(s) for s in match.group(1).split(",") if s.strip()]
    return "\n" + shape_text(sizes)


def _draw_cuts(dot: graphviz.Digraph, output: torch.Tensor, cut_edges, label: str) -> None:
    """Restyle the DOT lines of ``cut_edges`` as cuts: red, dashed, labelled."""
    wanted = {(str(id(e.source)), str(id(e.target))) for e in cut_edges}
    present = {(str(id(e.source)), str(id(e.target))) for e in backward_edges(output)}
    if not wanted <= present:
        raise ValueError(
            "cut_edges must be edges of this graph: take them from "
            "gp.backward_edges(output) (a BackwardEdge's source and target nodes)"
        )
    style = (
        f' [color="{palette.RED}" fontcolor="{palette.RED}" style=dashed penwidth=2'
        f" label={graphviz.quoting.quote(label)}]"
    )
    for i, line in enumerate(dot.body):
        edge = _EDGE_LINE.match(line)
        if edge and (edge.group(1), edge.group(2)) in wanted:
            dot.body[i] = line.rstrip("\n") + style + "\n"
