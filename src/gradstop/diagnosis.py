"""Why is my gradient None? A diagnosis read from the graph itself.

Two steps, as in the forward view (walk, then draw):

``facts``
    what the live objects say about ``tensor``: its dtype, ``requires_grad``,
    ``is_leaf``, ``grad_fn``, whether backward() from ``output`` reaches it
    (through its ``AccumulateGrad`` node for a leaf), the hooks on the way;
    and, given a recording from ``record()``, what ran: whether ``tensor``
    was used, and which operation cut its path (``detach``, ``.data``, a
    no-grad region, a copy, ``.item()``).
``RULES``
    a table of questions about those facts. ``why_no_grad`` follows it from
    the first question to a ``Reason``; ``decision_tree()`` draws the same
    table, so the picture cannot drift from the code.

``why_no_grad`` never guesses: where the facts cannot settle the cause (a
leaf that backward() does not reach, without a recording) it answers
``Reason.UNDECIDED`` and says what would settle it. ``grad_report`` runs it
on every named parameter of a model.
"""

from __future__ import annotations

import enum
import html
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import graphviz
import torch

from . import palette
from .forward import Recording, _Call
from .graph import backward_edges, backward_nodes, gradient_targets, hooks_on
from .pictures import Picture, check_alt, svg


class Reason(enum.Enum):
    """Why ``tensor.grad`` is what it is; the value is a short gloss."""

    OK = "reached; .grad holds a gradient"
    NOT_YET = "reached; .grad not filled yet"
    HOOKED = "reached through hooks"
    NON_LEAF = "reached, not kept: not a leaf"
    NOT_FLOAT = "integer dtype: no gradient"
    NO_REQUIRES_GRAD = "never asked for a gradient"
    SWITCHED_OFF = "switched off after the forward"
    LATE_REQUIRES_GRAD = "requires_grad set too late"
    DETACHED = "cut by detach()"
    DATA = "cut by .data"
    NO_GRAD = "computed with recording off"
    COPIED = "copied out of the graph"
    NOT_DIFFERENTIABLE = "through an integer result"
    LEFT_TORCH = "left PyTorch (item, numpy)"
    UNUSED = "not used"
    NOT_ON_PATH = "used, but not on the path"
    UNDECIDED = "cannot tell from what it sees"


# Labels in the decision tree wrap at this many characters.
WRAP = 16
# The reasons for which backward() from the output does reach the tensor.
REACHED = frozenset({Reason.OK, Reason.NOT_YET, Reason.HOOKED, Reason.NON_LEAF})

# ---------------------------------------------------------------------------
# 1. Facts: what the live objects and the recording say.


@dataclass(frozen=True)
class Cut:
    """An operation that made a tensor off the graph from one on it."""

    op: str  # as written: "detach()", ".data", "torch.tensor()", "linear()"
    kind: str  # "detach", "data", "no_grad", "copy", "integer result", "no derivative"
    source: str  # the name of its input ("" when the code gave it none)
    result: str  # the name of its output
    dtype: str  # its output's dtype, "torch.bool"
    mode: str = ""  # "no_grad()" or "inference_mode()" for kind "no_grad"


@dataclass(frozen=True)
class Trace:
    """What a recording says about one tensor and the output."""

    used: bool  # an operation other than an in-place one on itself took it
    used_with_grad: bool  # ... while it required grad
    made_by: Cut | None  # the cut that made this tensor, if one did
    cut: Cut | None  # the first cut on a recorded path from the tensor to the output
    exits: tuple[str, ...]  # how its values left PyTorch: ("detach()", "numpy()")
    reaches_output: bool  # some recorded result of the tensor leads to the output
    unseen: bool  # a change the recorder did not see lies on that path


@dataclass(frozen=True)
class Facts:
    tensor: str  # the names the sentences use
    output: str
    dtype: torch.dtype
    requires_grad: bool
    is_leaf: bool
    retains_grad: bool
    grad_fn: str
    leaves_behind: tuple[str, ...]  # its inputs, if all are leaves, described
    copy_of_leaf: bool  # made from one input only, a leaf: .to(), .double(), a view
    reached: bool  # backward() from the output reaches the tensor
    in_graph: bool  # its AccumulateGrad node sits in the output's graph
    grad: torch.Tensor | None  # .grad, read only where PyTorch keeps one
    hooks: tuple[str, ...]  # hooks on the path, "hook double on h"
    # custom autograd Functions backward() runs (on the path if reached, else anywhere):
    # their backward may send gradient where the graph shows no edge, or return None
    opaque: tuple[str, ...]
    trace: Trace | None  # None without a recording
    cut: Cut | None  # the cut that made it (if it does not require grad) or cut its path


def facts(output, tensor, recording=None, names=("tensor", "output")) -> Facts:
    """Gather the facts ``RULES`` asks about (inputs already checked)."""
    targets = gradient_targets(output)
    nodes = {node for node, _ in targets}
    in_graph = any(getattr(node, "variable", None) is tensor for node in nodes)
    if tensor.grad_fn is not None:
        reached = (tensor.grad_fn, tensor.output_nr) in targets
    else:  # a leaf: through its AccumulateGrad; an output that is itself a leaf
        reached = tensor.requires_grad and (in_graph or tensor is output)
    kept = tensor.is_leaf or tensor.retains_grad
    found = None if recording is None else trace(recording, output, tensor)
    cut = None if found is None else found.cut if tensor.requires_grad else found.made_by
    return Facts(
        tensor=names[0],
        output=names[1],
        dtype=tensor.dtype,
        requires_grad=tensor.requires_grad,
        is_leaf=tensor.is_leaf,
        retains_grad=tensor.retains_grad,
        grad_fn=type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else "",
        leaves_behind=_leaves_behind(tensor),
        copy_of_leaf=bool(_leaves_behind(tensor)) and len(tensor.grad_fn.next_functions) == 1,
        reached=reached,
        in_graph=in_graph,
        grad=tensor.grad if kept else None,  # a non-leaf's .grad would warn
        hooks=_hooks_on_path(output, tensor, recording, names) if reached else (),
        opaque=_opaque(_path_nodes(output, tensor) if reached else backward_nodes(output)),
        trace=found,
        cut=cut,
    )


def _leaves_behind(tensor) -> tuple[str, ...]:
    """The leaves a computed tensor was made from in one operation, if only leaves.

    ``torch.randn(3, requires_grad=True).to(torch.float64)``: the float32 leaf
    that randn made is the one whose .grad backward() fills, though nothing may
    name it any more.
    """
    if tensor.grad_fn is None:
        return ()
    inputs = [node for node, _ in tensor.grad_fn.next_functions if node is not None]
    leaves = [getattr(node, "variable", None) for node in inputs]
    if not leaves or any(leaf is None for leaf in leaves):
        return ()
    return tuple(f"a {leaf.dtype} leaf of shape {tuple(leaf.shape)}" for leaf in leaves)


def _opaque(nodes) -> tuple[str, ...]:
    """The custom autograd Functions among ``nodes`` (a module hook's node passes through)."""
    custom = [
        type(node).__name__
        for node in nodes
        if isinstance(node, torch.autograd.function.BackwardCFunction)
        and type(node).__name__ != MODULE_HOOK_NODE
    ]
    return tuple(sorted(set(custom)))


# The node a module's backward hook (register_full_backward_hook) puts into the graph.
MODULE_HOOK_NODE = "BackwardHookFunctionBackward"


def _path_nodes(output, tensor) -> set:
    """The backward nodes between ``output`` and ``tensor`` (both ends included)."""
    edges = backward_edges(output)
    start = tensor.grad_fn
    if start is None:
        mine = (e.source for e in edges if getattr(e.source, "variable", None) is tensor)
        start = next(mine, None)
    towards_output: dict[object, list] = {}
    for edge in edges:
        towards_output.setdefault(edge.source, []).append(edge.target)
    on_path, stack = set(), [start] if start is not None else []
    while stack:
        node = stack.pop()
        if node not in on_path:
            on_path.add(node)
            stack.extend(towards_output.get(node, []))
    return on_path


def _hooks_on_path(output, tensor, recording, names) -> tuple[str, ...]:
    """Hooks that backward() from ``output`` to ``tensor`` runs, where we can see them.

    PyTorch does not list a computed tensor's hooks on its backward node, so
    hooks on intermediate results are found through the recording's tensors.
    """
    path = _path_nodes(output, tensor)
    seen = [(tensor, names[0]), (output, names[1])]
    if recording is not None:
        for state in recording.states:
            if state.tensor.grad_fn in path and all(state.tensor is not t for t, _ in seen):
                seen.append(
                    (state.tensor, _recorded_name(recording, state.tensor) or "an unnamed result")
                )
    found = []
    for t, name in seen:
        if t is tensor or t.grad_fn in path:
            found += [f"{hook} on {name}" for hook in hooks_on(t)]
    if any(type(node).__name__ == MODULE_HOOK_NODE for node in path):
        found.append("a module's backward hook (register_full_backward_hook or its pre-hook)")
    return tuple(dict.fromkeys(found))


# ---------------------------------------------------------------------------
# What a recording says: uses, cuts, exits.


def _recorded_name(recording: Recording, tensor: torch.Tensor) -> str:
    return recording.names.get(id(tensor), "")


def _closure(starts: set[int], links: dict[int, set[int]]) -> set[int]:
    """``starts`` and every state reached from them through ``links``."""
    found, stack = set(starts), list(starts)
    while stack:
        for nxt in links.get(stack.pop(), ()):
            if nxt not in found:
                found.add(nxt)
                stack.append(nxt)
    return found


def _connected(state) -> bool:
    return state.grad_fn is not None or state.requires_grad


def _cut(recording: Recording, call, near: set[int]) -> Cut | None:
    """``call`` as a Cut if it took a tensor on the graph and made one off it.

    Off the graph: no graph at all, or a new leaf (``copy.deepcopy(p)``,
    ``nn.Parameter(h)``), whose gradient stays with it. The Cut names the input
    among ``near`` (the states computed from the tensor asked about), if any.
    """
    states = recording.states
    indices = sorted(call.inputs, key=lambda i: i not in near)  # near ones first
    taken = [states[i] for i in indices if _connected(states[i])]
    mine = {id(s.tensor) for s in taken}
    made = [
        states[i]
        for i in call.outputs
        if not _connected(states[i])
        or (states[i].grad_fn is None and id(states[i].tensor) not in mine)
    ]
    if not made or not taken:
        return None
    out, mode = made[0], "inference_mode()" if call.inference else "no_grad()"
    if call.name == "data":
        kind = "data"
    elif call.name.split(".")[0] in ("detach", "detach_"):  # also aten's "detach.default"
        kind = "detach"
    elif not call.grad_enabled:
        kind = "no_grad"
    elif not (out.tensor.is_floating_point() or out.tensor.is_complex()):
        kind = "integer result"
    elif call.name in COPY_OPS:
        kind = "copy"
    else:  # a float result without a graph: an operation PyTorch does not differentiate
        kind = "no derivative"
    source = _recorded_name(recording, taken[0].tensor)
    result = _recorded_name(recording, out.tensor)
    mode = mode if kind == "no_grad" else ""
    return Cut(_op_text(call.name), kind, source, result, str(out.tensor.dtype), mode)


# Operations that build a new tensor from another's values, without its graph.
COPY_OPS = frozenset({"tensor", "new_tensor", "new leaf"})


def _op_text(name: str) -> str:
    special = {
        "data": ".data",
        "tensor": "torch.tensor()",
        "new leaf": "a new leaf made from its memory (nn.Parameter(), copy.deepcopy())",
    }
    return special.get(name, f"{name}()")


def trace(recording: Recording, output, tensor) -> Trace:
    """Follow ``tensor`` through the recording towards ``output``."""
    states, calls = recording.states, recording.calls + _new_leaves(recording)
    mine = {i for i, s in enumerate(states) if s.tensor is tensor}
    outs = {i for i, s in enumerate(states) if s.tensor is output}
    ahead_links: dict[int, set[int]] = {}
    behind_links: dict[int, set[int]] = {}
    for call in calls:
        for i in call.inputs:
            ahead_links.setdefault(i, set()).update(call.outputs)
        for o in call.outputs:
            behind_links.setdefault(o, set()).update(call.inputs)
    ahead, behind = _closure(mine, ahead_links), _closure(outs, behind_links)
    uses = [c for c in calls if mine & set(c.inputs) and set(c.outputs) - mine]
    uses += [c for c in recording.exits if mine & set(c.inputs)]
    cuts = [(c, cut) for c in calls if not c.unseen and (cut := _cut(recording, c, ahead))]
    on_path = [cut for c, cut in cuts if ahead & set(c.inputs) and behind & set(c.outputs)]
    between = [c for c in calls if ahead & set(c.inputs) and behind & set(c.outputs)]
    return Trace(
        used=bool(uses),
        used_with_grad=any(states[i].requires_grad for c in uses for i in mine & set(c.inputs)),
        made_by=next((cut for c, cut in cuts if mine & set(c.outputs)), None),
        cut=on_path[0] if on_path else None,
        exits=_exits(recording, ahead, behind_links, cuts),
        reaches_output=bool(ahead & outs),
        unseen=any(c.unseen for c in between),
    )


def _new_leaves(recording: Recording) -> list[_Call]:
    """Links the recorder cannot see: a new leaf sharing memory with an earlier result.

    ``nn.Parameter(h)`` and ``copy.deepcopy(p)`` make a leaf that requires grad
    from another tensor's memory without a recorded operation; the leaf shows up
    first as an input. Each such leaf is linked to the latest earlier state of
    another tensor with the same memory (not itself a leaf that requires grad).
    """
    states = recording.states
    made = {o for call in recording.calls for o in call.outputs}
    first: dict[int, int] = {}
    for i, state in enumerate(states):
        first.setdefault(id(state.tensor), i)
    links = []
    by_memory: dict[int, list[int]] = {}  # data_ptr -> earlier states that may be the source
    for i, state in enumerate(states):
        t = state.tensor
        if t.numel() == 0:
            continue
        new_leaf = not (
            i in made or first[id(t)] != i or t.grad_fn is not None or not state.requires_grad
        )
        if new_leaf:
            earlier = [j for j in by_memory.get(t.data_ptr(), ()) if states[j].tensor is not t]
            if earlier:
                links.append(_Call("new leaf", [earlier[-1]], [i]))
        if not (state.grad_fn is None and state.requires_grad):
            by_memory.setdefault(t.data_ptr(), []).append(i)
    return links


def _exits(recording: Recording, ahead: set[int], behind_links, cuts) -> tuple[str, ...]:
    """The cuts and exits by which values computed from the tensor left PyTorch."""
    found: list[str] = []
    for call in recording.exits:
        if not ahead & set(call.inputs):
            continue
        before = _closure(set(call.inputs), behind_links)
        found += [cut.op for c, cut in cuts if ahead & set(c.inputs) and before & set(c.outputs)]
        found.append(_op_text(call.name))
    return tuple(dict.fromkeys(found))


# ---------------------------------------------------------------------------
# 2. The rules: one table of questions, read by why_no_grad and by the figure.


@dataclass(frozen=True)
class Question:
    """One question about the facts; each answer leads to a question (key) or a Reason."""

    key: str
    text: str  # as the figure shows it
    answer: Callable[[Facts], str]
    branches: dict[str, str | Reason]


def _yes(value: bool) -> str:
    return "yes" if value else "no"


# Which Reason each kind of cut leads to (a Cut's kind is one of these keys).
CUT_REASONS = {
    "detach": Reason.DETACHED,
    "data": Reason.DATA,
    "no_grad": Reason.NO_GRAD,
    "copy": Reason.COPIED,
    "integer result": Reason.NOT_DIFFERENTIABLE,
    "no derivative": Reason.NOT_DIFFERENTIABLE,
}


def _path_answer(f: Facts) -> str:
    if f.trace.unseen:
        return "an unrecorded change"
    if f.cut is not None:
        return "a cut"
    if f.trace.exits:
        return "left PyTorch"
    return "an uncut path" if f.trace.reaches_output else "no path"


RULES: tuple[Question, ...] = (
    Question(
        "dtype",
        "floating-point or complex dtype?",
        lambda f: _yes(f.dtype.is_floating_point or f.dtype.is_complex),
        {"yes": "requires", "no": Reason.NOT_FLOAT},
    ),
    Question(
        "requires",
        "tensor.requires_grad?",
        lambda f: _yes(f.requires_grad),
        {"yes": "reached", "no": "switched"},
    ),
    Question(
        "switched",
        "its AccumulateGrad in output's graph?",
        lambda f: _yes(f.in_graph),
        {"yes": Reason.SWITCHED_OFF, "no": "made"},
    ),
    Question(
        "made",
        "recorded: made by a cut?",
        lambda f: "yes" if f.cut else "no, or not recorded",
        {"yes": "kind", "no, or not recorded": Reason.NO_REQUIRES_GRAD},
    ),
    Question(
        "reached",
        "backward() from output reaches it?",
        lambda f: _yes(f.reached),
        {"yes": "keeps", "no": "opaque"},
    ),
    Question(
        "opaque",
        "a custom autograd Function in output's graph?",
        lambda f: _yes(bool(f.opaque)),
        {"yes": Reason.UNDECIDED, "no": "recorded"},
    ),
    Question(
        "keeps",
        "a leaf, or retain_grad() called?",
        lambda f: _yes(f.is_leaf or f.retains_grad),
        {"yes": "filled", "no": Reason.NON_LEAF},
    ),
    Question(
        "filled",
        "tensor.grad holds a tensor?",
        lambda f: _yes(f.grad is not None),
        {"yes": "hooks", "no": Reason.NOT_YET},
    ),
    Question(
        "hooks",
        "hooks on the path?",
        lambda f: _yes(bool(f.hooks)),
        {"yes": Reason.HOOKED, "no": Reason.OK},
    ),
    Question(
        "recorded",
        "forward pass recorded?",
        lambda f: _yes(f.trace is not None),
        {"yes": "used", "no": Reason.UNDECIDED},
    ),
    Question(
        "used",
        "recorded: used by an operation?",
        lambda f: _yes(f.trace.used),
        {"yes": "late", "no": Reason.UNUSED},
    ),
    Question(
        "late",
        "recorded: required grad when used?",
        lambda f: _yes(f.trace.used_with_grad),
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


# ---------------------------------------------------------------------------
# 3. One sentence per reason: the cause and the fix.

SENTENCES = {
    Reason.OK: "backward() from {output} reaches {tensor}, and {tensor}.grad holds a "
    "gradient (the sum over every backward() since it was last reset){zeros}.",
    Reason.NOT_YET: "the graph of {output} reaches {tensor}, but {tensor}.grad is None "
    "because no backward() has filled it since it was made or reset (optimizer.zero_grad() "
    "sets None){not_yet}: read it after a backward() through this path and before the next "
    "zero_grad().",
    Reason.HOOKED: "backward() from {output} reaches {tensor} through {hooks}, and what a hook "
    "returns replaces the gradient: if {tensor}.grad is wrong (zeros), fix what the hook "
    "returns or remove it with its handle.",
    Reason.NON_LEAF: "{tensor} is not a leaf (grad_fn={grad_fn}{behind}), so backward() "
    "passes its gradient on without keeping it: {non_leaf_fix}.",
    Reason.NOT_FLOAT: "{tensor} has dtype {dtype}, and only floating-point and complex "
    "tensors can have gradients: make it a float tensor (.float()) before it is used.",
    Reason.NO_REQUIRES_GRAD: "{tensor} does not require grad, so autograd computes no "
    "gradient for it: create it with requires_grad=True, or call {tensor}.requires_grad_() "
    "before the forward pass (if it is a copy of another tensor, record the forward pass "
    "to see what made it).",
    Reason.SWITCHED_OFF: "{tensor} required grad when {output} was computed, but was "
    "switched off afterwards (detach_() or requires_grad_(False)), and backward() then "
    "skips it without a word: to train it on this step and freeze it from the next, "
    "switch it off after backward(); to freeze it now, before the forward pass.",
    Reason.LATE_REQUIRES_GRAD: "{tensor} did not require grad when the forward pass used "
    "it, and switching it on afterwards does not change what was recorded: set "
    "requires_grad=True before computing {output}.",
    Reason.DETACHED: "{cut}, and detach() returns the same values with no graph: use the "
    "tensor itself where the gradient should flow.",
    Reason.DATA: "{cut}, and .data returns the same values with no graph (and hides "
    "in-place changes from autograd): use the tensor itself, or detach() where you mean "
    "to stop the gradient.",
    Reason.NO_GRAD: "{cut}, which ran with gradient recording off ({mode}): compute it "
    "outside that region (a function or forward decorated with @torch.no_grad() cannot "
    "train what it computes).",
    Reason.COPIED: "{cut}, which copies the values into a new tensor with no graph: use the "
    "tensor itself where the gradient should flow (torch.stack or torch.cat to combine "
    "tensors, not torch.tensor; no nn.Parameter around a computed value).",
    Reason.NOT_DIFFERENTIABLE: "{cut}, {flat}: use a differentiable stand-in (a sigmoid "
    "instead of a comparison, softmax instead of argmax, interpolation between neighbours "
    "instead of an index rounded from a float).",
    Reason.LEFT_TORCH: "no recorded operation carries {tensor} to {output}: its values left "
    "PyTorch through {exits}, and a Python number or NumPy array carries no graph. If that "
    "value was used to compute {output}, keep that computation in torch operations; if it "
    "was only logged or printed, nothing from {tensor} reaches {output} (a loss term "
    "computed and never added): add it to {output}.",
    Reason.UNUSED: "no recorded operation used {tensor}, so, if the recording covers the "
    "whole forward pass, {output} does not depend on it (a layer never called, a branch not "
    "taken, a copy of the model used instead): compute {output} from it, or leave it out of "
    "the optimizer.",
    Reason.NOT_ON_PATH: "{tensor} was used, but nothing computed from it reaches {output} "
    "(a loss term computed and never added, a result left unused): add it to {output}, or "
    "stop computing it.",
    Reason.UNDECIDED: "{tensor} requires grad, and {undecided}",
}

_UNRECORDED = (
    "backward() from {output} does not reach it; the graph alone cannot say why (not "
    "used, or cut by detach(), .data, no_grad() or a copy): run the forward pass inside "
    "`with gradstop.record() as rec:` and ask again with recording=rec."
)

_ZEROS_SEEN = (
    " (all zeros, and no tensor or module hook seen on the path: look at the derivative "
    "itself, such as a flat step like round() or a ReLU that is off for every input, or "
    "at a zero_grad(set_to_none=False) with no backward() since)"
)

_ZEROS_UNSEEN = (
    " (all zeros: a flat step on the path, such as round() or a ReLU that is off for "
    "every input, a zero_grad(set_to_none=False) with no backward() since, or a hook on "
    "an intermediate result could do that; those hooks are seen only with recording=rec)"
)

_OPAQUE = (
    "the graph of {output} shows no path to it, but backward() also runs {opaque}, a "
    "custom autograd Function whose backward the graph cannot see into (reentrant "
    "checkpointing is one): it may reach {tensor} from there, or not; look at "
    "{tensor}.grad after backward()."
)

_UNSEEN = (
    "backward() from {output} does not reach it; something the recording did not see "
    "changed a tensor between them (an in-place change with torch functions disabled, a "
    "custom autograd Function), so the recording cannot say what cut the path."
)

_UNEXPLAINED = (
    "backward() from {output} does not reach it; the recording shows a path to {output} "
    "with no cut: this tool cannot tell why, so look at the operations between them "
    "with gradstop.forward_view(rec, {output})."
)


def sentence(reason: Reason, f: Facts) -> str:
    """The plain sentence for ``reason``, filled in from the facts."""
    trace, cut = f.trace, f.cut
    zeros = f.grad is not None and f.grad.numel() > 0 and not f.grad.any()
    fields = {
        "tensor": f.tensor,
        "output": f.output,
        "grad_fn": f.grad_fn,
        "dtype": str(f.dtype),
        "hooks": ", ".join(f.hooks),
        "exits": " then ".join(trace.exits) if trace else "",
        "cut": _cut_text(cut, f) if cut else "",
        "flat": _flat_text(cut) if cut else "",
        "mode": cut.mode if cut else "",
        "zeros": (_ZEROS_SEEN if trace else _ZEROS_UNSEEN) if zeros else "",
        "not_yet": _not_yet_text(f),
        "behind": _behind_text(f.leaves_behind),
        "non_leaf_fix": _non_leaf_fix(f),
    }
    fields["undecided"] = _undecided(f).format(**fields, opaque=" and ".join(f.opaque))
    return SENTENCES[reason].format(**fields)


def _behind_text(leaves: tuple[str, ...]) -> str:
    if not leaves:
        return ""
    return f"; computed in one operation from {' and '.join(leaves)}, whose .grad backward() fills"


def _flat_text(cut: Cut) -> str:
    if cut.kind == "integer result":
        return (
            f"which returns a {cut.dtype} tensor, and integer and boolean results carry no gradient"
        )
    return f"and PyTorch has no derivative for {cut.op}, so its result carries no graph"


def _not_yet_text(f: Facts) -> str:
    parts = []
    if f.hooks:
        parts.append(f"; backward() will run {', '.join(f.hooks)} on the way")
    if f.opaque:
        parts.append(
            f"; if backward() has already run, {' and '.join(f.opaque)} on the path (a custom "
            "autograd Function) may have returned None for it"
        )
    return "".join(parts)


def _non_leaf_fix(f: Facts) -> str:
    read = f"to read its gradient, call {f.tensor}.retain_grad() before backward()"
    train = (
        f"if {f.tensor} is meant to be trained, create it as a leaf in its final form "
        "(with its dtype and device, or do the operation first, then requires_grad_())"
    )
    # a copy of one leaf (.to(), .cuda(), .double(), a view): most likely meant as the leaf
    return f"{train}; {read}" if f.copy_of_leaf else f"{read}; {train}"


def _undecided(f: Facts) -> str:
    trace = f.trace
    if f.opaque:
        return _OPAQUE
    if trace is None:
        return _UNRECORDED
    return _UNSEEN if trace.unseen else _UNEXPLAINED


def _cut_text(cut: Cut, f: Facts) -> str:
    source = cut.source or "an unnamed result"
    if not f.requires_grad:
        return f"{f.tensor} was made by {cut.op} from {source}"
    where = ""
    if cut.source and cut.result and cut.source != cut.result:
        where = f", where {cut.source} became {cut.result}"
    elif cut.source:
        where = f", applied to {cut.source}"
    elif cut.result:
        where = f", which made {cut.result}"
    return f"the path from {f.tensor} to {f.output} is cut at {cut.op}{where}"


# ---------------------------------------------------------------------------
# 4. why_no_grad


@dataclass(frozen=True)
class Diagnosis:
    """Why ``tensor.grad`` is what it is: a reason code and one sentence.

    ``trail`` lists the questions of ``RULES`` that led here, each with its answer.
    """

    reason: Reason
    sentence: str
    trail: tuple[str, ...] = ()

    @property
    def reached(self) -> bool:
        """Does backward() from the output send gradient to the tensor?"""
        return self.reason in REACHED

    def __str__(self) -> str:
        """The reason and its sentence, wrapped to fit a notebook or a page."""
        return textwrap.fill(f"{self.reason.name}: {self.sentence}", 78, subsequent_indent="  ")

    __repr__ = __str__


def why_no_grad(output, tensor, *, recording: Recording | None = None) -> Diagnosis:
    """Why ``tensor`` gets no gradient (or a surprising one) from ``output.backward()``.

    ``output`` is the tensor you call backward() on (or will); ``tensor`` the one
    whose ``.grad`` is missing. With ``recording`` (from ``with gradstop.record()
    as rec:`` around the forward pass) it also says which operation cut the path.
    """
    _check(output, tensor, recording)
    names = _names(output, tensor, recording, sys._getframe(1))
    return diagnose(output, tensor, recording, names)


def diagnose(output, tensor, recording, names: tuple[str, str]) -> Diagnosis:
    """why_no_grad without the checks and the name lookup (grad_report passes names)."""
    f = facts(output, tensor, recording, names)
    reason, trail = decide(f)
    return Diagnosis(reason, sentence(reason, f), trail)


def _check(output, tensor, recording) -> None:
    for role, value in (("output", output), ("tensor", tensor)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{role} must be a torch.Tensor, got {type(value).__name__}: "
                "call why_no_grad(loss, w) with the tensor you call backward() on "
                "and the tensor whose gradient is missing"
            )
    if recording is not None and not isinstance(recording, Recording):
        raise TypeError(
            "recording must be the Recording from `with gradstop.record() as rec:`, "
            f"got {type(recording).__name__}"
        )
    if output.grad_fn is None and not output.requires_grad:
        raise ValueError(
            "output has no autograd graph (requires_grad is False, grad_fn is None), so "
            "backward() on it raises 'element 0 of tensors does not require grad': nothing "
            "it was computed from required grad at the time (no_grad(), inference_mode(), "
            "detach(), requires_grad set too late). Pass an output that has a graph."
        )
    if (
        output.grad_fn is None
        and tensor.grad_fn is not None
        and any(getattr(node, "variable", None) is output for node in backward_nodes(tensor))
    ):
        raise ValueError(
            "output is a leaf that tensor was computed from: the arguments look swapped; "
            "call why_no_grad(loss, w) with the tensor you call backward() on first"
        )
    if recording is not None and not any(s.tensor is output for s in recording.states):
        raise ValueError(
            "output was not computed inside this recording: run the forward pass that "
            "makes it inside `with gradstop.record() as rec:`"
        )


def _names(output, tensor, recording, caller) -> tuple[str, str]:
    """What the sentences call the two tensors: the recording's or the caller's names."""
    found = []
    for obj, fallback in ((tensor, "tensor"), (output, "output")):
        name = None
        if recording is not None and any(s.tensor is obj for s in recording.states):
            name = recording.names.get(id(obj))
        if name is None:
            name = _local_name(obj, caller.f_locals, caller.f_globals) or fallback
        found.append(name)
    return found[0], found[1]


def _local_name(obj, local: dict, shared: dict) -> str | None:
    """The caller's one variable holding ``obj``, or ``model.weight`` for a parameter.

    A parameter is named after a module among the caller's variables (local
    first, then global).
    """
    bound = [k for k, v in local.items() if v is obj and _is_name(k)]
    if len(bound) == 1:
        return bound[0]
    for k, v in [*local.items(), *shared.items()]:
        if isinstance(v, torch.nn.Module) and _is_name(k):
            for name, p in v.named_parameters(remove_duplicate=False):
                if p is obj:
                    return k + _attribute_path(name)
    return None


def _attribute_path(name: str) -> str:
    """A parameter's dotted name as Python spells the access: "0.gain" -> "[0].gain".

    A number indexes (nn.Sequential, nn.ModuleList), a name is an attribute,
    anything else a key (nn.ModuleDict).
    """
    parts = name.split(".")
    return "".join(
        f"[{p}]" if p.isdigit() else f".{p}" if p.isidentifier() else f"[{p!r}]" for p in parts
    )


def _is_name(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


# ---------------------------------------------------------------------------
# 5. grad_report: every parameter of a model at once


@dataclass(frozen=True)
class ParameterRow:
    name: str
    reached: bool  # does backward() from the loss reach this parameter?
    stepped: bool | None  # is it in the optimizer? (None: no optimizer given)
    diagnosis: Diagnosis


@dataclass(frozen=True)
class GradReport:
    """One row per named parameter (a shared one under each of its names)."""

    rows: tuple[ParameterRow, ...]

    @property
    def reached(self) -> frozenset[str]:
        return frozenset(r.name for r in self.rows if r.reached)

    @property
    def reasons(self) -> dict[str, Reason]:
        return {r.name: r.diagnosis.reason for r in self.rows}

    @property
    def not_stepped(self) -> frozenset[str]:
        """Parameters that get a gradient the optimizer never uses."""
        return frozenset(r.name for r in self.rows if r.reached and r.stepped is False)

    def _notes(self, row: ParameterRow) -> str:
        if not row.reached:
            return row.diagnosis.sentence
        if row.stepped is False:
            return "gets a gradient, but is not in the optimizer: it never changes"
        return ""

    def __repr__(self) -> str:
        lines = []
        for row in self.rows:
            mark = "reached" if row.reached else "NOT reached"
            lines.append(f"{row.name}: {mark}, {row.diagnosis.reason.name}")
            if self._notes(row):
                lines.append(f"    {self._notes(row)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        stepped = any(r.stepped is not None for r in self.rows)
        head = ["parameter", "reached", *(["in the optimizer"] if stepped else []), "reason", "why"]
        cells = [f"<th>{h}</th>" for h in head]
        body = []
        for row in self.rows:
            values = [f"<code>{html.escape(row.name)}</code>", _yes(row.reached)]
            values += [_yes(bool(row.stepped))] if stepped else []
            values += [row.diagnosis.reason.name, html.escape(self._notes(row))]
            body.append("<tr>" + "".join(f"<td>{v}</td>" for v in values) + "</tr>")
        return f"<table><tr>{''.join(cells)}</tr>{''.join(body)}</table>"


def grad_report(loss, model, *, optimizer=None, recording: Recording | None = None) -> GradReport:
    """For each named parameter of ``model``: does backward() from ``loss`` reach it, and why not.

    With ``optimizer``, each row also says whether the optimizer holds that
    very tensor (a parameter replaced after the optimizer was built is not).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        got = type(optimizer).__name__
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {got}")
    _check(loss, loss, recording)
    loss_name = _names(loss, loss, recording, sys._getframe(1))[1]
    held = None
    if optimizer is not None:
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    rows = []
    for name, parameter in model.named_parameters(remove_duplicate=False):
        found = diagnose(loss, parameter, recording, (name, loss_name))
        stepped = None if held is None else id(parameter) in held
        rows.append(ParameterRow(name, found.reached, stepped, found))
    return GradReport(tuple(rows))


# ---------------------------------------------------------------------------
# 6. The decision tree, drawn from RULES


@dataclass(frozen=True, repr=False)
class DecisionTree(Picture):
    """RULES as a picture, with what it shows as data (names, for assertions)."""

    reasons: frozenset[str] = frozenset()  # the Reason names drawn
    questions: frozenset[str] = frozenset()  # the question texts drawn

    def __repr__(self) -> str:
        return f"DecisionTree({len(self.questions)} questions, {len(self.reasons)} reasons)"


def _target(step: str | Reason) -> str:
    return step.name if isinstance(step, Reason) else step


def _reason_style(reason: Reason) -> dict[str, str]:
    if reason in REACHED:
        return {"fillcolor": palette.BLUE_FILL, "color": palette.BLUE}
    if reason in CUT_REASONS.values() or reason is Reason.LEFT_TORCH:
        return {"fillcolor": "white", "color": palette.RED, "fontcolor": palette.RED}
    return {"fillcolor": palette.GREY_FILL, "color": palette.GREY}


def _wrap(text: str) -> str:
    return textwrap.fill(text, WRAP, break_long_words=False, break_on_hyphens=False)


def draw_rules() -> tuple[graphviz.Digraph, set[Reason]]:
    """RULES as a Graphviz graph, top to bottom; and the reasons it drew.

    A yes/no question with one reason among its answers has that reason beside
    it; a question whose many answers are all reasons is one table.
    """
    dot = graphviz.Digraph(
        graph_attr={"bgcolor": "white", "rankdir": "TB", "nodesep": "0.1", "ranksep": "0.25"},
        node_attr={"fontname": "monospace", "fontsize": "10", "margin": "0.05,0.02"},
        edge_attr={"fontname": "monospace", "fontsize": "9", "color": palette.GREY_LINE},
    )
    drawn: set[Reason] = set()
    for question in RULES:
        steps = list(question.branches.values())
        reasons = [step for step in steps if isinstance(step, Reason)]
        drawn.update(reasons)
        if len(steps) > 2 and len(reasons) == len(steps):
            dot.node(question.key, _table_label(question), shape="plain")
            continue
        dot.node(question.key, _wrap(question.text), shape="box", style="rounded")
        answers: dict[str, list[str]] = {}  # one edge per target, its answers stacked
        for answer, step in question.branches.items():
            answers.setdefault(_target(step), []).append(answer)
        for target, said in answers.items():
            dot.edge(question.key, target, label=" \n".join(f" {a} " for a in said))
        if len(steps) == 2 and len(reasons) == 1:
            with dot.subgraph() as beside:
                beside.attr(rank="same")
                beside.node(question.key)
                beside.node(reasons[0].name)
        for reason in reasons:
            label = f"{reason.name}\n{_wrap(reason.value)}"
            dot.node(reason.name, label, shape="box", style="filled", **_reason_style(reason))
    return dot, drawn


def _table_label(question: Question) -> str:
    """A question and its answers as one Graphviz HTML-like table."""
    rows = "".join(
        f'<TR><TD ALIGN="RIGHT">{html.escape(answer)}</TD><TD ALIGN="LEFT">'
        f'<FONT COLOR="{_reason_style(step)["color"]}">{step.name}</FONT></TD></TR>'
        for answer, step in question.branches.items()
    )
    head = f'<TR><TD COLSPAN="2">{html.escape(question.text)}</TD></TR>'
    table = '<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="2" STYLE="ROUNDED">'
    return f"<{table}{head}{rows}</TABLE>>"


def describe_rules() -> str:
    """RULES in words: the figure's alt text."""
    parts = [f"Decision tree of why_no_grad, read top to bottom, from '{RULES[0].text}'."]
    for question in RULES:
        answers = "; ".join(
            f"{answer}: " + (step.name if isinstance(step, Reason) else f"'{QUESTIONS[step].text}'")
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
        questions=frozenset(q.text for q in RULES),
    )
