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
``record()`` and ``forward_view(recording, output, alt=...)``
    the forward computation as the reader wrote it: tensors under their variable
    names, operations as boxes, a ``detach``/``detach_``/``.data`` drawn as a red
    dashed cut, tensors that receive no gradient greyed out, the gradient path in
    bold blue. Which tensors get a gradient is read from the graph autograd
    recorded, not guessed.

``plot_picture(fig, alt=...)``
    a matplotlib figure as the same kind of picture: SVG, alt text, caption,
    byte-stable from run to run.

In both kinds of graph picture a tensor with hooks (``register_hook``,
``register_post_accumulate_grad_hook``) carries a purple note naming them.

Every picture carries alt text and renders as an HTML ``<figure>`` with the SVG
inlined, so the alt text and caption reach the built book unchanged.
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
from torch.overrides import TorchFunctionMode

__all__ = [
    "Picture",
    "SideBySide",
    "ForwardPicture",
    "Recording",
    "backward_graph",
    "side_by_side",
    "record",
    "forward_view",
    "count_grad_fns",
    "grad_fn_names",
    "hooks_on",
    "plot_picture",
]

# A node line is "\t<name> [attrs]"; an edge line is "\t<name> -> <name> [attrs]".
# torchviz's names are id()s, all digits; the names this module adds are not.
_NODE_LINE = re.compile(r"^\t(\w+)( \[)")
_EDGE_LINE = re.compile(r"^\t(\w+) -> (\w+)\b")
_FREED = "after they have already been freed"
HOOK_COLOR = "#7b3294"
CUT_COLOR = "#d62728"
GRAD_COLOR = "#1f5fa8"


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

    svg: str = field(repr=False)  # long; the HTML view shows it
    alt: str = ""
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
            '<div style="display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start">'
            f"{cells}</div>"
            f"<figcaption>{_inline_code(self.caption)}</figcaption></figure>"
        )


def count_grad_fns(output: torch.Tensor) -> int:
    """How many backward nodes are reachable from ``output`` (walked without recursion)."""
    return len(grad_fn_names(output))


def grad_fn_names(output: torch.Tensor) -> list[str]:
    """Sorted type names of the backward nodes reachable from ``output`` (what torchviz draws)."""
    return sorted(type(fn).__name__ for fn in {fn for fn, _ in _reached_by_backward(output)})


def _stable_source(dot: graphviz.Digraph) -> str:
    """DOT source with torchviz's id()-based node names replaced by n0, n1, ..."""
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
        body.append(line)
    stable = dot.copy()
    stable.body = body
    return stable.source


def hooks_on(tensor: torch.Tensor) -> list[str]:
    """Names of the hooks registered on ``tensor`` now, in the order they will run."""
    names = [
        f"hook {getattr(h, '__name__', type(h).__name__)}"
        for h in (getattr(tensor, "_backward_hooks", None) or {}).values()
    ]
    names += [
        f"post-accumulate hook {getattr(h, '__name__', type(h).__name__)}"
        for h in (getattr(tensor, "_post_accumulate_grad_hooks", None) or {}).values()
    ]
    return names


def _hook_note(dot: graphviz.Digraph, key: str, target: str, label: str) -> None:
    dot.node(
        key,
        label,
        shape="note",
        style="filled",
        fillcolor="#f3e8f7",
        color=HOOK_COLOR,
        fontcolor=HOOK_COLOR,
    )
    dot.edge(key, target, style="dashed", color=HOOK_COLOR, arrowhead="none")


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
    # torchviz cannot see hooks: mark each named tensor that has some. A hook on a
    # leaf sits on the leaf's box; on a computed tensor, beside its backward node.
    for label, tensor in (names or {}).items():
        hooks = hooks_on(tensor)
        if hooks:
            target = id(tensor) if tensor.grad_fn is None else id(tensor.grad_fn)
            _hook_note(
                dot, f"hook_{len(dot.body)}", str(target), f"on {label}:\n" + "\n".join(hooks)
            )
    dot.graph_attr.update(bgcolor="white")
    return Picture(svg=_svg(_stable_source(dot)), alt=alt, caption=caption)


def _svg(source: str) -> str:
    return graphviz.Source(source).pipe(format="svg", encoding="utf-8")


def plot_picture(fig, *, alt: str, caption: str | None = None) -> Picture:
    """A matplotlib figure as a Picture (the figure is closed, so it shows only once)."""
    import matplotlib.pyplot as plt

    if not hasattr(fig, "savefig"):
        raise TypeError(f"expected a matplotlib Figure, got {type(fig).__name__}")
    alt = _check_alt(alt)
    buffer = io.StringIO()
    # A fixed salt and no date: the same figure gives the same bytes on every run.
    with plt.rc_context({"svg.hashsalt": "where-gradients-stop", "svg.fonttype": "path"}):
        fig.savefig(
            buffer, format="svg", metadata={"Date": None}, bbox_inches="tight", facecolor="white"
        )
    plt.close(fig)
    return Picture(svg=buffer.getvalue(), alt=alt, caption=caption)


def side_by_side(before: Picture, after: Picture, *, caption: str) -> SideBySide:
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
    return SideBySide(before, after, caption)


# ---------------------------------------------------------------------------
# The forward view: record what ran, then draw it with the cuts visible.

# Calls that produce a tensor sharing data but cut from the graph.
CUT_OPS = {"detach", "detach_", "data"}


@dataclass
class _Op:
    name: str
    inputs: list[int]  # value-node indices
    outputs: list[int]


@dataclass
class _Value:
    tensor: torch.Tensor  # kept alive, so no id() is reused while recorded
    grad_fn: object  # the tensor's grad_fn when this value was made
    output_nr: int
    state: int  # 0 for a tensor's first recorded state, 1 after an in-place op, ...


@dataclass
class Recording:
    """What ran inside ``with record() as rec:``: values, operations, and the caller's names."""

    values: list[_Value] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # id(tensor) -> variable name
    _latest: dict[int, int] = field(default_factory=dict)  # id(tensor) -> newest value index

    def _value(self, tensor: torch.Tensor, *, new: bool) -> int:
        key = id(tensor)
        if not new and key in self._latest:
            return self._latest[key]
        state = self.values[self._latest[key]].state + 1 if key in self._latest else 0
        self.values.append(_Value(tensor, tensor.grad_fn, tensor.output_nr, state))
        self._latest[key] = len(self.values) - 1
        return self._latest[key]


def _tensors_in(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors_in(item)]
    return []


def _op_name(func) -> str | None:
    name = getattr(func, "__name__", None)
    if name == "__get__":  # attribute reads: only .data makes a new tensor worth drawing
        owner = getattr(getattr(func, "__self__", None), "__name__", None)
        return "data" if owner == "data" else None
    if name is None:
        return None
    return name.strip("_") if name.startswith("__") else name


class _Recorder(TorchFunctionMode):
    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = _op_name(func)
        outputs = _tensors_in(result)
        if name is not None and outputs:
            rec = self.recording
            inputs = [
                rec._value(t, new=False) for t in _tensors_in(args) + _tensors_in(kwargs or {})
            ]
            rec.ops.append(_Op(name, inputs, [rec._value(t, new=True) for t in outputs]))
        return result


@contextlib.contextmanager
def record():
    """Record every torch operation run inside the block (results are unchanged).

    On leaving the block, the caller's variable names are noted, so the picture
    can label ``x``, ``u``, ``y`` as the reader wrote them.
    """
    recording = Recording()
    caller = sys._getframe(2)  # the frame running the `with` statement
    with _Recorder(recording):
        yield recording
    recording.names = {
        id(v): k
        for k, v in caller.f_locals.items()
        if isinstance(v, torch.Tensor) and not k.startswith("_")
    }


def _reached_by_backward(output: torch.Tensor) -> set[tuple[object, int]]:
    """(backward node, output number) pairs that backward() from ``output`` sends gradient to."""
    if output.grad_fn is None:
        return set()
    reached = {(output.grad_fn, output.output_nr)}
    seen, stack = set(), [output.grad_fn]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for nxt, nr in fn.next_functions:
            if nxt is not None:
                reached.add((nxt, nr))
                stack.append(nxt)
    return reached


def _gets_gradient(value: _Value, reached) -> bool:
    if value.grad_fn is not None:
        return (value.grad_fn, value.output_nr) in reached
    # A leaf gets gradient through its AccumulateGrad node.
    return any(getattr(fn, "variable", None) is value.tensor for fn, _ in reached)


@dataclass(frozen=True)
class ForwardPicture(Picture):
    """A forward view, with what it shows as data (for tests and for captions)."""

    labels: tuple[str, ...] = ()  # every value node's label
    greyed: tuple[str, ...] = ()  # sorted labels of values that get no gradient,
    # one per node (unnamed values may repeat)
    cut_edges: tuple[tuple[str, str], ...] = ()  # (input label, output label) of each cut
    hooked: tuple[tuple[str, str], ...] = ()  # (label, hook name)


def forward_view(
    recording: Recording,
    output: torch.Tensor,
    *,
    alt: str,
    caption: str | None = None,
    names: dict[str, torch.Tensor] | None = None,
) -> ForwardPicture:
    """Draw ``recording`` top to bottom, with the gradient path of ``output`` marked.

    Bold blue: values (and the edges between them) that backward() from ``output``
    sends gradient to. Grey: values it sends nothing. Red dashed: a cut
    (``detach``, ``detach_``, ``.data``). Purple notes: hooks on a tensor.
    ``names`` adds or overrides labels (``{"label": tensor}``).
    """
    if not isinstance(recording, Recording):
        raise TypeError(
            f"expected the Recording from `with record() as rec:`, got {type(recording).__name__}"
        )
    output = _check_output(output)
    alt = _check_alt(alt)
    if not recording.ops:
        raise ValueError(
            "the recording is empty: run the forward computation inside `with record() as rec:`"
        )
    labels_by_id = dict(recording.names)
    labels_by_id.update({id(t): k for k, t in (names or {}).items()})
    if id(output) not in {id(v.tensor) for v in recording.values}:
        raise ValueError(
            "output was not computed inside this recording: pass a tensor the block produced"
        )

    reached = _reached_by_backward(output)
    states = {}
    for v in recording.values:
        states[id(v.tensor)] = max(states.get(id(v.tensor), 0), v.state)

    def label(i: int) -> str:
        v = recording.values[i]
        name = labels_by_id.get(id(v.tensor), "")
        if name and states[id(v.tensor)] > 0:
            name = f"{name} (v{v.state})"  # one tensor, several in-place states
        shape = str(tuple(v.tensor.shape))
        return f"{name}\n{shape}" if name else shape

    used = sorted({i for op in recording.ops for i in op.inputs + op.outputs})
    labels = {i: label(i) for i in used}
    gets = {i: _gets_gradient(recording.values[i], reached) for i in used}
    # The newest state of a tensor carries its hooks.
    newest = {id(recording.values[i].tensor): i for i in used}

    dot = graphviz.Digraph(
        graph_attr={"bgcolor": "white", "rankdir": "TB", "nodesep": "0.3"},
        node_attr={"fontname": "monospace", "fontsize": "10"},
    )
    hooked = []
    for i in used:
        text = labels[i]
        if gets[i]:
            dot.node(
                f"v{i}",
                text,
                shape="box",
                style="rounded,filled,bold",
                fillcolor="#dbe9f7",
                color=GRAD_COLOR,
            )
        else:
            dot.node(
                f"v{i}",
                text,
                shape="box",
                style="rounded,filled",
                fillcolor="#eeeeee",
                color="#9a9a9a",
                fontcolor="#8a8a8a",
            )
        if newest[id(recording.values[i].tensor)] == i:
            for hook in hooks_on(recording.values[i].tensor):
                _hook_note(dot, f"h{i}_{len(hooked)}", f"v{i}", hook)
                hooked.append((text.split("\n")[0] or text, hook))

    cut_edges = []
    for k, op in enumerate(recording.ops):
        cut = op.name in CUT_OPS
        if cut:
            dot.node(
                f"op{k}",
                f"✂ {op.name}",
                shape="box",
                style="dashed",
                color=CUT_COLOR,
                fontcolor=CUT_COLOR,
            )
        else:
            dot.node(f"op{k}", op.name, shape="plaintext")
        for i in op.inputs:
            on_path = not cut and gets[i] and any(gets[j] for j in op.outputs)
            dot.edge(f"v{i}", f"op{k}", **_edge_style(cut, on_path))
        for j in op.outputs:
            on_path = not cut and gets[j]
            dot.edge(f"op{k}", f"v{j}", **_edge_style(cut, on_path))
            if cut:
                cut_edges += [(labels[i], labels[j]) for i in op.inputs]

    return ForwardPicture(
        svg=_svg(dot.source),
        alt=alt,
        caption=caption,
        labels=tuple(labels[i] for i in used),
        greyed=tuple(sorted(labels[i] for i in used if not gets[i])),
        cut_edges=tuple(cut_edges),
        hooked=tuple(hooked),
    )


def _edge_style(cut: bool, on_path: bool) -> dict[str, str]:
    if cut:
        return {"color": CUT_COLOR, "style": "dashed", "penwidth": "2"}
    if on_path:
        return {"color": GRAD_COLOR, "penwidth": "2.2"}
    return {"color": "#b0b0b0"}
