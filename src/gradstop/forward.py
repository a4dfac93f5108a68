"""The forward view: the computation as the reader wrote it, with the cuts drawn.

Three steps, each small enough to read on its own (after micrograd's
``trace()`` and ``draw_dot()``):

``record()``
    runs the reader's code unchanged and notes every torch operation.
``walk(recording, output)``
    turns the recording into plain records, one ``Value`` per tensor state
    (name, shape, whether backward() from ``output`` sends it gradient, its
    hooks) and one ``Step`` per operation (``cut`` for ``detach``,
    ``detach_`` and ``.data``). Which tensors get a gradient is read from the
    graph autograd recorded, not guessed.
``forward_view(recording, output, alt=...)``
    walks, then draws: tensors under their variable names, operations as
    boxes, a cut as a red dashed box, tensors that receive no gradient greyed
    out, the gradient path in bold blue, hooks as purple notes.

A run of three or more operations whose in-between results have no name
(``-(p * z).sum(dim=1).mean()``) is drawn as one box, "mul → sum → mean → neg",
so that long tails do not make the picture tall. A tensor changed in place is
drawn once per state, ``m`` and then ``m after detach_()``.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import graphviz
import torch
from torch.overrides import TorchFunctionMode

from . import palette
from .graph import gradient_targets, hooks_on
from .pictures import Picture, check_alt, check_output, hook_note, shape_text, svg

# Calls that produce a tensor sharing data but cut from the graph.
CUT_OPS = {"detach", "detach_", "data"}
# Calls that turn a tensor's values into a Python number, list or NumPy array.
EXIT_OPS = {"item", "tolist", "numpy", "float", "int", "index", "array"}
# Runs of at least this many operations joined by unnamed results become one box.
FOLD_AT = 3
# What else a run says, for the diagnosis (gradstop.diagnosis adds these): each
# BEFORE(recording, func, args, kwargs) runs before a call (backward() may raise), each
# AFTER(recording, func, args, kwargs, result, call) after it, with the _Call noted
# for it (or None). They note backward passes, .grad reads, hooks, module hooks.
BEFORE: list[Callable] = []
AFTER: list[Callable] = []
# Backward passes: not operations of the forward pass (the diagnosis notes them).
PASSES = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)

# ---------------------------------------------------------------------------
# 1. Record what ran.


@dataclass
class _Recorded:
    tensor: torch.Tensor  # kept alive, so no id() is reused while recorded
    grad_fn: object  # the tensor's grad_fn when this state was made
    output_nr: int
    made_by: str  # the operation that made this state
    in_place: tuple[str, ...]  # in-place operations since the tensor was made
    requires_grad: bool = False  # the tensor's flag when this state was made


@dataclass
class _Call:
    name: str
    inputs: list[int]  # indices into Recording.states
    outputs: list[int]
    grad_enabled: bool = True  # False under no_grad(), set_grad_enabled(False), ...
    inference: bool = False  # True under inference_mode()
    # An input changed since its recorded state by something the recorder did not
    # see (its grad_fn or requires_grad differ): what the recording says is stale.
    unseen: bool = False
    where: str = ""  # the reader's line that ran it, for a call that cuts (the diagnosis)
    region: str = ""  # "CheckpointFunction": the custom Function whose forward ran it
    # Inputs whose version counter the call moved without returning them: a write inside
    # it (nn.Embedding's max_norm renormalises its weight in place while looking up).
    wrote: tuple = ()


@dataclass
class Recording:
    """What ran inside ``with record() as rec:``: tensor states, calls, the caller's names."""

    states: list[_Recorded] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    # Calls that turned tensors into Python numbers or NumPy arrays (EXIT_OPS).
    exits: list[_Call] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # id(tensor) -> variable name
    notes: dict[str, object] = field(default_factory=dict)  # what BEFORE and AFTER note
    _latest: dict[int, int] = field(default_factory=dict)  # id(tensor) -> newest state

    def state_of(self, tensor: torch.Tensor) -> int:
        """The newest recorded state of ``tensor`` (recorded now if it is new)."""
        if id(tensor) not in self._latest:
            return self.new_state(tensor, made_by="")
        return self._latest[id(tensor)]

    def new_state(self, tensor: torch.Tensor, *, made_by: str) -> int:
        """Record ``tensor`` as the output of ``made_by`` (in place if already known)."""
        previous = self._latest.get(id(tensor))
        in_place = () if previous is None else (*self.states[previous].in_place, made_by)
        state = _Recorded(
            tensor, tensor.grad_fn, tensor.output_nr, made_by, in_place, tensor.requires_grad
        )
        self.states.append(state)
        self._latest[id(tensor)] = len(self.states) - 1
        return self._latest[id(tensor)]


def _version(tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # an inference tensor has no version counter
        return None


def _written_inside(tensors, versions, outputs) -> tuple:
    """The inputs a call wrote to in place without returning them."""
    return tuple(
        t
        for t, before in zip(tensors, versions, strict=True)
        if before is not None and (_version(t) or 0) > before and not any(t is o for o in outputs)
    )


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


def _changed(state: _Recorded, tensor: torch.Tensor) -> bool:
    return tensor.grad_fn is not state.grad_fn or tensor.requires_grad != state.requires_grad


def _tracing(tensors) -> bool:
    """torch.compile tracing (fake tensors, no real values): nothing to record."""
    fake = torch._subclasses.fake_tensor.FakeTensor
    return torch.compiler.is_compiling() or any(isinstance(t, fake) for t in tensors)


class _Recorder(TorchFunctionMode):
    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording
        # torch.compile'd code runs eagerly while recorded, so every operation is seen;
        # torch.compile imports torch._dynamo, so it is there before compiled code runs.
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and not hasattr(_Recorder.__torch_function__, "_torchdynamo_disable"):
            _Recorder.__torch_function__ = dynamo.disable(_Recorder.__torch_function__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rec, name = self.recording, _op_name(func)
        # The inputs' states are noted before the call, as they were when it ran.
        tensors = _tensors_in(args) + _tensors_in(kwargs or {})
        if _tracing(tensors):
            return func(*args, **(kwargs or {}))
        inputs = [rec.state_of(t) for t in tensors]
        mode = {"grad_enabled": torch.is_grad_enabled()}
        mode["inference"] = torch.is_inference_mode_enabled()
        mode["unseen"] = any(
            _changed(rec.states[i], t) for i, t in zip(inputs, tensors, strict=True)
        )
        for note in BEFORE:
            note(rec, func, args, kwargs or {})
        versions = [_version(t) for t in tensors]
        result = func(*args, **(kwargs or {}))
        outputs, call = _tensors_in(result), None
        if name == "setitem" and tensors:  # x[mask] = 0 returns None but writes into x
            outputs = tensors[:1]
        if name is not None and outputs and func not in PASSES:
            made = [rec.new_state(t, made_by=name) for t in outputs]
            call = _Call(name, inputs, made, **mode)
            call.wrote = _written_inside(tensors, versions, outputs)
            rec.calls.append(call)
        elif name in EXIT_OPS and inputs:
            call = _Call(name, inputs, [], **mode)
            rec.exits.append(call)
        for note in AFTER:
            note(rec, func, args, kwargs or {}, result, call)
        return result


@contextlib.contextmanager
def _noting_from_numpy(recording: Recording):
    """``torch.from_numpy`` is one of the functions a TorchFunctionMode never sees.

    While recording, ``torch.from_numpy`` notes the tensor it makes as a call with
    no tensor input (as ``torch.tensor(array)`` is noted), so a NumPy round trip
    (``torch.from_numpy(np.exp(h.detach().numpy()))``) is seen coming back.
    """
    original = torch.from_numpy

    def from_numpy(array):
        result = original(array)
        made = recording.new_state(result, made_by="from_numpy")
        recording.calls.append(_Call("from_numpy", [], [made], torch.is_grad_enabled()))
        return result

    torch.from_numpy = from_numpy
    try:
        yield
    finally:
        torch.from_numpy = original


@contextlib.contextmanager
def record():
    """Record every torch operation run inside the block (results are unchanged).

    On leaving the block, the caller's variable names are noted, so the picture
    can label ``x``, ``u``, ``y`` as the reader wrote them.
    """
    recording = Recording()
    caller = sys._getframe(2)  # the frame running the `with` statement
    with _Recorder(recording), _noting_from_numpy(recording):
        yield recording
    recording.names = {
        id(v): k
        for k, v in caller.f_locals.items()
        if isinstance(v, torch.Tensor) and k.isidentifier() and not k.startswith("_")
    }


# ---------------------------------------------------------------------------
# 2. Walk the recording into plain records.


@dataclass(frozen=True)
class Value:
    """One state of one tensor, as the forward view draws it."""

    key: str  # the node's name in the drawing
    name: str  # "x", "m after detach_()", or "" when the code gave it no name
    shape: tuple[int, ...]
    gets_grad: bool  # does backward() from the output send it gradient?
    hooks: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What the box says (for display only; assert on ``name``)."""
        shape = shape_text(self.shape)
        return f"{self.name}\n{shape}" if self.name else shape


@dataclass(frozen=True)
class Step:
    """One operation (or a folded run of them) between values."""

    key: str
    name: str  # "mul", "detach", or "mul → sum → mean" for a folded run
    inputs: tuple[str, ...]  # Value keys
    outputs: tuple[str, ...]
    cut: bool


def walk(recording: Recording, output: torch.Tensor, names=None) -> tuple[list, list]:
    """The recording as plain records: (values, steps), with long tails folded.

    ``names`` (``{"label": tensor}``) adds to or overrides the variable names.
    """
    by_id = {**recording.names, **{id(t): k for k, t in (names or {}).items()}}
    targets = gradient_targets(output)
    used = sorted({i for call in recording.calls for i in call.inputs + call.outputs})
    newest = {id(recording.states[i].tensor): i for i in used}
    values = []
    for i in used:
        state = recording.states[i]
        # A tensor's hooks are drawn on its newest state.
        hooks = hooks_on(state.tensor) if newest[id(state.tensor)] == i else []
        name = by_id.get(id(state.tensor), "")
        values.append(_value(f"v{i}", state, name, targets, hooks))
    steps = [_step(k, call) for k, call in enumerate(recording.calls)]
    return _fold(values, steps, keep={f"v{newest[id(output)]}"})


def _value(key: str, state: _Recorded, name: str, targets: set, hooks: list) -> Value:
    if name and state.in_place:
        name = f"{name} after {', '.join(op + '()' for op in state.in_place)}"
    gets = _gets_gradient(state, targets)
    return Value(key, name, tuple(state.tensor.shape), gets, tuple(hooks))


def _step(index: int, call: _Call) -> Step:
    inputs = tuple(f"v{i}" for i in call.inputs)
    outputs = tuple(f"v{i}" for i in call.outputs)
    return Step(f"op{index}", call.name, inputs, outputs, cut=call.name in CUT_OPS)


def _gets_gradient(state: _Recorded, targets: set) -> bool:
    if state.grad_fn is not None:
        return (state.grad_fn, state.output_nr) in targets
    # A leaf gets gradient through its AccumulateGrad node.
    return any(getattr(node, "variable", None) is state.tensor for node, _ in targets)


def _fold(values: list[Value], steps: list[Step], keep: set[str]) -> tuple[list, list]:
    """Merge runs of FOLD_AT or more steps joined by values that only pass through.

    A value passes through when it has no name, no hooks, one producer, one
    consumer that has no other input, and the same gradient status as the next.
    """
    by_key = {v.key: v for v in values}
    uses = Counter(k for s in steps for k in s.inputs)
    consumer = {k: s for s in steps for k in s.inputs}

    def passes(step: Step) -> Step | None:
        if step.cut or len(step.outputs) != 1 or step.outputs[0] in keep:
            return None
        value, nxt = by_key[step.outputs[0]], consumer.get(step.outputs[0])
        if value.name or value.hooks or uses[value.key] != 1 or nxt is None:
            return None
        if nxt.cut or len(nxt.inputs) != 1 or len(nxt.outputs) != 1:
            return None
        return nxt if by_key[nxt.outputs[0]].gets_grad == value.gets_grad else None

    folded, gone, absorbed = [], set(), set()
    for step in steps:
        if step.key in absorbed:
            continue
        run = [step]
        while (nxt := passes(run[-1])) is not None:
            run.append(nxt)
        if len(run) < FOLD_AT:
            folded.append(step)
            continue
        absorbed.update(s.key for s in run[1:])
        gone.update(s.outputs[0] for s in run[:-1])
        folded.append(Step(step.key, _run_name(run), step.inputs, run[-1].outputs, False))
    return [v for v in values if v.key not in gone], folded


def _run_name(run: list[Step]) -> str:
    """A folded run's name, "sum → mean → neg"; a repeated operation with a count, "mul ×2000"."""
    parts: list[list] = []
    for step in run:
        if parts and parts[-1][0] == step.name:
            parts[-1][1] += 1
        else:
            parts.append([step.name, 1])
    return " → ".join(name if n == 1 else f"{name} ×{n}" for name, n in parts)


# ---------------------------------------------------------------------------
# 3. Draw the records.


def draw(values: list[Value], steps: list[Step]) -> graphviz.Digraph:
    """The forward view of these records, top to bottom."""
    dot = graphviz.Digraph(
        graph_attr={"bgcolor": "white", "rankdir": "TB", "nodesep": "0.3"},
        node_attr={"fontname": "monospace", "fontsize": "10"},
    )
    for value in values:
        _draw_value(dot, value)
    gets = {v.key: v.gets_grad for v in values}
    for step in steps:
        _draw_step(dot, step, gets)
    return dot


def _draw_value(dot: graphviz.Digraph, value: Value) -> None:
    if value.gets_grad:
        style = {"style": "rounded,filled,bold", "fillcolor": palette.BLUE_FILL}
        style["color"] = palette.BLUE
    else:
        style = {"style": "rounded,filled", "fillcolor": palette.GREY_FILL}
        style.update(color=palette.GREY, fontcolor=palette.GREY_TEXT)
    dot.node(value.key, value.label, shape="box", **style)
    for n, hook in enumerate(value.hooks):
        hook_note(dot, f"h{value.key}_{n}", value.key, hook)


def _draw_step(dot: graphviz.Digraph, step: Step, gets: dict[str, bool]) -> None:
    if step.cut:
        dot.node(
            step.key,
            f"✂ {step.name}",
            shape="box",
            style="dashed",
            color=palette.RED,
            fontcolor=palette.RED,
        )
    else:
        dot.node(step.key, step.name, shape="plaintext")
    for key in step.inputs:
        on_path = gets[key] and any(gets[out] for out in step.outputs)
        dot.edge(key, step.key, **_edge_style(step.cut, on_path))
    for key in step.outputs:
        dot.edge(step.key, key, **_edge_style(step.cut, gets[key]))


def _edge_style(cut: bool, on_path: bool) -> dict[str, str]:
    if cut:
        return {"color": palette.RED, "style": "dashed", "penwidth": "2"}
    if on_path:
        return {"color": palette.BLUE, "penwidth": "2.2"}
    return {"color": palette.GREY_LINE}


# ---------------------------------------------------------------------------
# Walk, then draw.


@dataclass(frozen=True, repr=False)
class ForwardPicture(Picture):
    """A forward view, with what it shows as data: records and sets of names."""

    values: tuple[Value, ...] = ()
    steps: tuple[Step, ...] = ()

    @property
    def greyed_names(self) -> frozenset[str]:
        """Names of the drawn values that receive no gradient."""
        return frozenset(v.name for v in self.values if v.name and not v.gets_grad)

    @property
    def cut_names(self) -> frozenset[tuple[str, str]]:
        """(input name, output name) of each cut; "" stands for an unnamed value."""
        name = {v.key: v.name for v in self.values}
        return frozenset(
            (name[i], name[o]) for s in self.steps if s.cut for i in s.inputs for o in s.outputs
        )

    @property
    def hooked_names(self) -> frozenset[str]:
        """Names of the values that carry hooks."""
        return frozenset(v.name for v in self.values if v.hooks)

    def __repr__(self) -> str:
        return (
            f"ForwardPicture(greyed_names={sorted(self.greyed_names)}, "
            f"cut_names={sorted(self.cut_names)}, hooked_names={sorted(self.hooked_names)})"
        )


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
    output = check_output(output)
    alt = check_alt(alt)
    if not recording.calls:
        raise ValueError(
            "the recording is empty: run the forward computation inside `with record() as rec:`"
        )
    if id(output) not in {id(s.tensor) for s in recording.states}:
        raise ValueError(
            "output was not computed inside this recording: pass a tensor the block produced"
        )
    values, steps = walk(recording, output, names)
    return ForwardPicture(
        svg=svg(draw(values, steps).source),
        alt=alt,
        caption=caption,
        values=tuple(values),
        steps=tuple(steps),
    )
