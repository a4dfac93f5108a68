"""What a recording says about one tensor and an output: its uses, the cuts, the exits.

A recording (``gradstop.record()``) is a list of tensor states and the calls
between them. ``trace`` follows the tensor forward through those calls towards
the output and reports, as plain data (a ``Trace``):

- whether it was used at all, and while it required grad;
- every recorded use of it, and what became of each (reaches the output, is cut,
  leaves PyTorch, reaches nothing);
- the first cut on a path from it to the output (``detach()``, ``.data``, a
  no-grad region, a copy, an operation with no derivative, a reentrant
  checkpoint), and every cut beside a path that still reaches it (part of the
  gradient is then missing);
- how its values left PyTorch (``.item()``, ``.numpy()``) and whether a tensor
  made from outside data reaches the output after that (a round trip);
- the backward passes run from the output, and whether one read ``.grad`` to
  make the tensor (``w = w - lr * w.grad``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..forward import Recording, _Call
from . import recorder

# Operations that build a new tensor from another's values, without its graph.
COPY_OPS = frozenset({"tensor", "as_tensor", "asarray", "new_tensor", "new leaf"})
# Operations that make a tensor from data outside PyTorch (a NumPy array, numbers).
FROM_DATA = recorder.FROM_DATA
# Operations that read only their input's shape, dtype and device: a result made by one
# never carried the input's gradient, so nothing of it is lost there.
SHAPE_ONLY = frozenset(
    {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like"}
    | {"randint_like", "new_zeros", "new_ones", "new_empty", "new_full"}
)
# Cuts that never drop a part of a gradient that reaches the tensor another way: an
# integer or bool result (an index, a comparison for where() or masked_fill) has no
# gradient to lose, and inside a custom Function's forward its backward decides.
NOT_LOST = frozenset({"integer result", "custom Function"})
# The legacy constructors, which the recorder does not see: only the float() they call.
LEGACY = re.compile(r"`(?:[\w.]*\.)?((?:Float|Double|Half|BFloat16|Long|Int)?Tensor)\(")


@dataclass(frozen=True)
class Cut:
    """An operation that made a tensor off the graph from one on it."""

    op: str  # as written: "detach()", ".data", "torch.tensor()", "linear()"
    kind: str  # a key of rules.CUT_REASONS: "detach", "data", "no_grad", "copy", ...
    source: str  # the name of its input ("" when the code gave it none)
    result: str  # the name of its output
    dtype: str  # its output's dtype, "torch.bool"
    mode: str = ""  # "no_grad()" or "inference_mode()" for kind "no_grad"
    where: str = ""  # the reader's code: "`h.detach()`, line 3"
    region: str = ""  # the custom autograd Function whose forward ran it
    # Its result got a graph afterwards, from the custom Function it ran in: the
    # Function's backward sends gradient to the Function's inputs (only).
    connected_later: bool = False
    # The states it made off the graph (max(dim)'s indices, not its values).
    made: tuple[int, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Trace:
    """What a recording says about one tensor and the output."""

    used: bool  # an operation other than an in-place one on itself took it
    used_with_grad: bool  # ... while it required grad
    made_by: Cut | None  # the cut that made this tensor, if one did
    cut: Cut | None  # the first cut on a recorded path from the tensor to the output
    lost: tuple[Cut, ...]  # cuts whose input still gets gradient: a part of it is lost
    exits: tuple[str, ...]  # how its values left PyTorch: ("detach()", "numpy()")
    round_trip: str  # a tensor made from outside data after an exit, reaching the output
    reaches_output: bool  # some recorded result of the tensor leads to the output
    unseen: bool  # a change the recorder did not see lies on that path
    uses: tuple[str, ...]  # each recorded use and what became of it
    passes: tuple[recorder.Pass, ...]  # the backward passes run from the output
    fills: bool | None  # does one of them fill the tensor's .grad? (None: none recorded)
    emptied: bool  # one that should fill its .grad ran, and left it None
    from_grad: bool  # the tensor was computed from a .grad read (a manual update)
    in_checkpoint: bool  # used inside a reentrant checkpoint whose output is on the path


def name_of(recording: Recording, tensor: torch.Tensor) -> str:
    return recording.names.get(id(tensor), "")


def closure(starts: set[int], links: dict[int, set[int]]) -> set[int]:
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


def _kind(call, out) -> str:
    if call.name == "autograd.grad":
        return "autograd.grad"
    if call.name in ("data", "data ="):
        return "data"
    if call.name.split(".")[0] in ("detach", "detach_"):  # also aten's "detach.default"
        return "detach"
    if not call.grad_enabled:
        if call.region == "CheckpointFunction":
            return "checkpoint"
        return "custom Function" if call.region else "no_grad"
    if not (out.tensor.is_floating_point() or out.tensor.is_complex()):
        return "integer result"
    return "copy" if call.name in COPY_OPS else "no derivative"


def cut_of(recording: Recording, call, near: set[int]) -> Cut | None:
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
        i
        for i in call.outputs
        if not _connected(states[i])
        or (states[i].grad_fn is None and id(states[i].tensor) not in mine)
    ]
    if not made or not taken:
        return None
    out = states[made[0]]
    kind = _kind(call, out)
    mode = ("inference_mode()" if call.inference else "no_grad()") if kind == "no_grad" else ""
    source, result = name_of(recording, taken[0].tensor), name_of(recording, out.tensor)
    op, later = op_text(call.name), out.tensor.grad_fn is not None
    dtype = str(out.tensor.dtype)
    return Cut(op, kind, source, result, dtype, mode, call.where, call.region, later, tuple(made))


def op_text(name: str) -> str:
    special = {
        "data": ".data",
        "tensor": "torch.tensor()",
        "as_tensor": "torch.as_tensor()",
        "asarray": "torch.asarray()",
        "from_numpy": "torch.from_numpy()",
        "new leaf": "a new leaf made from its memory (nn.Parameter(), copy.deepcopy())",
        "data =": "an assignment to .data (p.data = value), which puts the values in "
        "without their graph",
        "autograd.grad": "torch.autograd.grad() without create_graph=True",
        "setitem": "an indexed assignment, x[index] = value, which writes in place (out of "
        "place: torch.where(), x.masked_fill() or x.index_put())",
    }
    return special.get(name, f"{name}()")


# ---------------------------------------------------------------------------
# Following the tensor.


@dataclass(frozen=True)
class Links:
    """The recording as links between states, seen from one tensor and one output."""

    calls: list  # the recorded calls, with the new leaves the recorder cannot see
    mine: set[int]  # the states of the tensor
    outs: set[int]  # the states of the output
    ahead: dict[int, set[int]]  # state -> the states a call made from it
    kept: dict[int, set[int]]  # the same, through calls that keep the graph
    behind: set[int]  # the states the output was computed from
    cuts: list  # (call, Cut) for each call that cut the graph

    def reach(self, starts: set[int], kept: bool = True) -> set[int]:
        return closure(starts, self.kept if kept else self.ahead)


def links(recording: Recording, output, tensor) -> Links:
    # An optimizer's step is not part of the forward pass: its calls are left out.
    steps = [c for c in recording.calls if c.region != recorder.STEP]
    states = recording.states
    calls = steps + _new_leaves(recording) + recorder.grad_calls(recording)
    mine = {i for i, s in enumerate(states) if s.tensor is tensor}
    outs = {i for i, s in enumerate(states) if s.tensor is output}
    ahead: dict[int, set[int]] = {}
    behind: dict[int, set[int]] = {}
    for call in calls:
        for i in call.inputs:
            ahead.setdefault(i, set()).update(call.outputs)
        for o in call.outputs:
            behind.setdefault(o, set()).update(call.inputs)
    near = closure(mine, ahead)
    cuts = [(c, cut) for c in calls if not c.unseen and (cut := cut_of(recording, c, near))]
    cut_ids = {id(c) for c, _ in cuts}
    kept: dict[int, set[int]] = {}
    for call in calls:
        if id(call) not in cut_ids:
            for i in call.inputs:
                kept.setdefault(i, set()).update(call.outputs)
    return Links(calls, mine, outs, ahead, kept, closure(outs, behind), cuts)


def trace(recording: Recording, output, tensor, output_name: str = "output") -> Trace:
    """Follow ``tensor`` through the recording towards ``output``."""
    g, states = links(recording, output, tensor), recording.states
    ahead = g.reach(g.mine, kept=False)
    uses = [c for c in g.calls if g.mine & set(c.inputs) and set(c.outputs) - g.mine]
    uses += [c for c in recording.exits if g.mine & set(c.inputs)]
    on_path = [cut for c, cut in g.cuts if ahead & set(c.inputs) and g.behind & set(c.outputs)]
    between = [c for c in g.calls if ahead & set(c.inputs) and g.behind & set(c.outputs)]
    # A custom Function gives what its forward returned a graph: a change that is seen.
    connected = {o for c in g.calls if c.region for o in c.outputs}
    in_checkpoint = _in_checkpoint(recording, g, output)
    lost = _lost(g)
    if in_checkpoint:  # backward recomputes the checkpointed block with grad on: not lost
        lost = tuple(cut for cut in lost if cut.kind != "checkpoint")
    return Trace(
        used=bool(uses),
        used_with_grad=any(states[i].requires_grad for c in uses for i in g.mine & set(c.inputs)),
        made_by=next((cut for c, cut in g.cuts if g.mine & set(c.outputs)), None),
        cut=on_path[0] if on_path else _legacy_copy(recording, ahead),
        lost=lost,
        exits=_exits(recording, g, ahead),
        round_trip=_round_trip(recording, g),
        reaches_output=bool(ahead & g.outs),
        unseen=any(c.unseen and not connected & set(c.inputs) for c in between),
        uses=tuple(dict.fromkeys(_use_text(recording, g, c, output_name) for c in uses)),
        passes=(ran := _passes(recording, output)),
        fills=_fills(ran, tensor),
        emptied=any(
            p.fills
            and (p.inputs is None or any(t is tensor for t in p.inputs))
            and id(tensor) in p.left_none
            for p in ran
        ),
        from_grad=from_grad(recording, g),
        in_checkpoint=in_checkpoint,
    )


def _passes(recording: Recording, output) -> tuple[recorder.Pass, ...]:
    return tuple(p for p in recorder.passes(recording) if any(t is output for t in p.outputs))


def _fills(passes, tensor) -> bool | None:
    """Did a backward pass fill ``tensor.grad``? autograd.grad and inputs= may not."""
    if not passes:
        return None
    return any(p.fills and (p.inputs is None or any(t is tensor for t in p.inputs)) for p in passes)


def _lost(g: Links) -> tuple[Cut, ...]:
    """Cuts whose input still carries the tensor's gradient, and whose result reaches the output.

    The result is what the cut made off the graph, not a sibling output that kept it
    (``max(dim)``'s values); and only a cut that drops a gradient counts (not
    ``NOT_LOST`` kinds, nor a ``SHAPE_ONLY`` constructor such as ``zeros_like``).
    """
    connected = g.reach(g.mine)
    return tuple(
        cut
        for c, cut in g.cuts
        if connected & set(c.inputs)
        and g.behind & set(cut.made or c.outputs)
        and not cut.connected_later
        and cut.kind not in NOT_LOST
        and c.name.split(".")[0] not in SHAPE_ONLY
    )


def _use_text(recording: Recording, g: Links, call, output: str) -> str:
    """One use of the tensor and what became of it: "mul(): reaches loss"."""
    op = op_text(call.name)
    if call in recording.exits:
        return f"{op}: leaves PyTorch"
    cut = next((cut for c, cut in g.cuts if c is call), None)
    if cut is not None and not cut.connected_later:
        return f"{op}: cuts the graph" + (
            f", and its result reaches {output}" if g.behind & set(call.outputs) else ""
        )
    if g.reach(set(call.outputs)) & g.outs:
        lost = [
            c
            for c, cut in g.cuts
            if g.reach(set(call.outputs)) & set(c.inputs) and g.behind & set(c.outputs)
        ]
        return f"{op}: reaches {output}" + (" (and is cut on another path)" if lost else "")
    if g.reach(set(call.outputs), kept=False) & g.outs:
        return f"{op}: reaches {output} only through a cut"
    return f"{op}: does not reach {output}"


def _exits(recording: Recording, g: Links, ahead: set[int]) -> tuple[str, ...]:
    """The cuts and exits by which values computed from the tensor left PyTorch."""
    found: list[str] = []
    behind_links: dict[int, set[int]] = {}
    for call in g.calls:
        for o in call.outputs:
            behind_links.setdefault(o, set()).update(call.inputs)
    for call in recording.exits:
        if not ahead & set(call.inputs):
            continue
        before = closure(set(call.inputs), behind_links)
        found += [cut.op for c, cut in g.cuts if ahead & set(c.inputs) and before & set(c.outputs)]
        found.append(_legacy_op(call) or op_text(call.name))
    return tuple(dict.fromkeys(found))


def _legacy_op(call) -> str:
    """ "torch.Tensor()" when an exit ran inside a legacy constructor, else ""."""
    match = LEGACY.match(call.where)
    return f"torch.{match[1]}()" if match else ""


def _legacy_copy(recording: Recording, ahead: set[int]) -> Cut | None:
    """``torch.Tensor(list)`` and kin: a copy the recorder sees only as float() calls."""
    for call in recording.exits:
        if ahead & set(call.inputs) and (op := _legacy_op(call)):
            source = name_of(recording, recording.states[call.inputs[0]].tensor)
            return Cut(op, "copy", source, "", "torch.float32", where=call.where)
    return None


def _round_trip(recording: Recording, g: Links) -> str:
    """Values computed from the tensor left PyTorch, and a tensor made from data came back."""
    ahead = g.reach(g.mine, kept=False)
    for out_call in recording.exits:
        if not ahead & set(out_call.inputs):
            continue
        if op := _legacy_op(out_call):
            return f"{op} at {out_call.where}" if out_call.where else op
        left = min(out_call.inputs)
        for back in g.calls:
            if back.name in FROM_DATA and not back.inputs and min(back.outputs) > left:
                if g.behind & set(back.outputs):
                    out = f" in {out_call.where}" if out_call.where else ""
                    where = f" in {back.where}" if back.where else ""
                    return f"{op_text(out_call.name)}{out}, then {op_text(back.name)}{where}"
    return ""


def from_grad(recording: Recording, g: Links) -> bool:
    """Was the tensor computed from a ``.grad`` read (``w = w - lr * w.grad``)?"""
    grads = {grad for _, grad in recorder.grad_reads(recording)}
    made = g.reach(grads, kept=False) & g.mine
    return any(recording.states[i].grad_fn is not None for i in made)


def _in_checkpoint(recording: Recording, g: Links, output) -> bool:
    """Used in a reentrant checkpoint whose output is on the path: backward recomputes it."""
    inside = [c for c in g.calls if c.region == "CheckpointFunction" and g.mine & set(c.inputs)]
    if not inside or output.grad_fn is None:
        return False
    from ..graph import backward_nodes

    nodes = backward_nodes(output)
    later = g.reach({o for c in inside for o in c.outputs}, kept=False)
    made = [recording.states[i].tensor.grad_fn for i in later]
    return any(type(n).__name__ == "CheckpointFunctionBackward" and n in nodes for n in made)


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
    found = []
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
            assigned = recorder.data_assignments(recording).get(id(t))
            if earlier and assigned is not None:  # param.data = value
                found.append(_Call("data =", [earlier[-1]], [i], where=assigned))
            elif earlier:
                found.append(_Call("new leaf", [earlier[-1]], [i]))
        if not (state.grad_fn is None and state.requires_grad):
            by_memory.setdefault(t.data_ptr(), []).append(i)
    return found
