"""Pictures of autograd graphs for the chapters of *Where Gradients Stop*.

One small module shared by every chapter (it sits beside the notebooks, so it
imports the same way in the built book, in JupyterLab and on Binder).

``backward_graph(out, alt=...)``
    torchviz's picture of the backward graph behind ``out``, made byte-stable:
    torchviz names each node by the Python ``id()`` of its object, so the same
    computation gives a different DOT file on every run. Here nodes are renamed
    ``n0, n1, ...`` in the order torchviz first visits them.
``side_by_side(before, after, caption=...)``
    two pictures as one figure, each with its own caption.

Every picture carries alt text and renders as an HTML ``<figure>`` with the SVG
inlined, so the alt text and caption reach the built book unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import html
import re
import sys
from dataclasses import dataclass

import graphviz
import torch
import torchviz

__all__ = ["Picture", "SideBySide", "backward_graph", "side_by_side", "count_grad_fns"]

# A node line is "\t<name> [attrs]"; an edge line is "\t<name> -> <name> [attrs]".
_NODE_LINE = re.compile(r"^(\t)(\d+)( \[)")
_EDGE_LINE = re.compile(r"^(\t)(\d+) -> (\d+)\b")
_FREED = "after they have already been freed"


def _inline_code(text: str) -> str:
    """Escape ``text`` for HTML, turning `backticked` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _check_alt(alt: object) -> str:
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(
            "alt text is required: describe in words what the picture shows, "
            "e.g. alt='x feeds AddBackward0, then MulBackward0, then MeanBackward0'"
        )
    return alt.strip()


@dataclass(frozen=True)
class Picture:
    """An SVG with its alt text and an optional caption; shows itself as HTML."""

    svg: str
    alt: str
    caption: str | None = None

    def img_html(self) -> str:
        data = base64.b64encode(self.svg.encode("utf-8")).decode("ascii")
        # The white background keeps black graph lines readable in dark mode.
        return (
            f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(self.alt)}" '
            'style="background:#fff;max-width:100%;height:auto;padding:4px">'
        )

    def _repr_html_(self) -> str:
        caption = f"<figcaption>{_inline_code(self.caption)}</figcaption>" if self.caption else ""
        return f'<figure class="gradient-graph">{self.img_html()}{caption}</figure>'


@dataclass(frozen=True)
class SideBySide:
    """Two pictures side by side, each with its caption, plus one overall caption."""

    left: Picture
    right: Picture
    caption: str

    def _repr_html_(self) -> str:
        cells = "".join(
            '<figure style="margin:0;flex:1 1 0;min-width:14em">'
            f"{p.img_html()}<figcaption>{_inline_code(p.caption or '')}</figcaption></figure>"
            for p in (self.left, self.right)
        )
        return (
            '<figure class="gradient-graph-pair">'
            f'<div style="display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start">{cells}</div>'
            f"<figcaption>{_inline_code(self.caption)}</figcaption></figure>"
        )


def count_grad_fns(output: torch.Tensor) -> int:
    """How many backward nodes are reachable from ``output`` (walked without recursion)."""
    seen, stack = set(), [output.grad_fn] if output.grad_fn is not None else []
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return len(seen)


def _stable_source(dot: graphviz.Digraph) -> str:
    """DOT source with torchviz's id()-based node names replaced by n0, n1, ..."""
    names: dict[str, str] = {}

    def rename(raw: str) -> str:
        return names.setdefault(raw, f"n{len(names)}")

    body = []
    for line in dot.body:
        edge = _EDGE_LINE.match(line)
        if edge:
            line = f"\t{rename(edge.group(2))} -> {rename(edge.group(3))}{line[edge.end():]}"
        else:
            line = _NODE_LINE.sub(lambda m: m.group(1) + rename(m.group(2)) + m.group(3), line)
        body.append(line)
    stable = dot.copy()
    stable.body = body
    return stable.source


@contextlib.contextmanager
def _recursion_room(frames: int):
    # torchviz walks the graph recursively, one Python frame per node.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, old + 2 * frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _check_output(output: object) -> torch.Tensor:
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


def backward_graph(
    output: torch.Tensor,
    *,
    alt: str,
    caption: str | None = None,
    names: dict[str, torch.Tensor] | None = None,
    show_saved: bool = False,
) -> Picture:
    """torchviz's backward graph of ``output`` as a byte-stable SVG picture.

    ``names`` maps labels to tensors (leaves, usually) so their boxes say which is
    which. ``show_saved=True`` also draws the tensors each node saved for backward;
    after ``backward()`` has freed them this raises ``ValueError`` saying so.
    """
    output = _check_output(output)
    alt = _check_alt(alt)
    if names is not None:
        bad = [k for k, v in names.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"names must map labels to tensors; not tensors: {bad}")
    try:
        with _recursion_room(count_grad_fns(output)):
            dot = torchviz.make_dot(output, params=names, show_saved=show_saved)
    except RuntimeError as err:
        if _FREED not in str(err):
            raise
        raise ValueError(
            "backward() has already freed the tensors this graph saved, so they cannot be "
            "drawn: draw before backward(), call backward(retain_graph=True), "
            "or draw with show_saved=False"
        ) from None
    dot.graph_attr.update(bgcolor="white")
    svg = graphviz.Source(_stable_source(dot)).pipe(format="svg", encoding="utf-8")
    return Picture(svg=svg, alt=alt, caption=caption)


def side_by_side(before: Picture, after: Picture, *, caption: str) -> SideBySide:
    """Show two pictures as one figure: ``before`` on the left, ``after`` on the right."""
    for side, pic in (("before", before), ("after", after)):
        if not isinstance(pic, Picture):
            raise TypeError(f"{side} must be a Picture (from backward_graph), got {type(pic).__name__}")
        if not pic.caption:
            raise ValueError(f"{side} needs its own caption, e.g. 'without detach'")
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("the pair needs a caption saying what changed between the two graphs")
    return SideBySide(before, after, caption)
