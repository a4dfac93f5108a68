"""Facts: what the live objects (and a recording, if given) say about one tensor.

``facts(output, tensor)`` reads the tensor's dtype, ``requires_grad``,
``is_leaf``, ``grad_fn``; whether ``backward()`` from ``output`` reaches it
(through its ``AccumulateGrad`` node for a leaf); the hooks on the way that can
change its gradient (a module's full backward hook cannot change that module's
own parameters); custom autograd Functions and ``torch.compile``'d code on the
way, whose insides the graph does not show; and, for a tensor that backward
does not reach, whether it is a fresh value computed from leaves that it does
reach (a parametrized weight, recomputed on every read). With a recording it
adds ``trace``: what ran (``recorded.trace``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..graph import backward_edges, backward_nodes, gradient_targets, hook_name, hooks_on
from . import recorder
from .recorded import Cut, Trace, name_of, trace

# The node a module's backward hook (register_full_backward_hook) puts into the graph.
MODULE_HOOK_NODE = "BackwardHookFunctionBackward"
# The node torch.compile's code puts into the graph (AOT autograd's custom Function).
COMPILED_NODE = "CompiledFunctionBackward"


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
    update_like: bool  # made in one step from a leaf holding a .grad, and a constant
    reached: bool  # backward() from the output reaches the tensor
    in_graph: bool  # its AccumulateGrad node sits in the output's graph
    grad: torch.Tensor | None  # .grad, read only where PyTorch keeps one
    hooks: tuple[str, ...]  # hooks on the path that can change its gradient
    notes: tuple[str, ...]  # what a module's hooks do not change, and why
    # custom autograd Functions backward() runs (on the path if reached, else anywhere):
    # their backward may send gradient where the graph shows no edge, or return None
    opaque: tuple[str, ...]
    compiled: bool  # torch.compile'd code on the path (or in the graph, if not reached)
    fresh_of: tuple[str, ...]  # the reached leaves a fresh, unreached non-leaf came from
    graphless: bool  # the output has no graph at all
    registered: bool | None  # a registered parameter of the model (None: no model asked)
    trace: Trace | None  # None without a recording
    cut: Cut | None  # the cut that made it (if it does not require grad) or cut its path


def facts(
    output, tensor, recording=None, names=("tensor", "output"), modules=None, registered=None
) -> Facts:
    """Gather the facts ``RULES`` asks about (inputs already checked)."""
    targets, modules = gradient_targets(output), modules or {}
    in_graph = any(getattr(node, "variable", None) is tensor for node, _ in targets)
    found = None if recording is None else trace(recording, output, tensor, names[1])
    reached = _reached(output, tensor, targets, in_graph) or bool(found and found.in_checkpoint)
    path = _path_nodes(output, tensor) if reached else backward_nodes(output)
    hooks, notes = _hooks(output, tensor, path, recording, names, modules) if reached else ((), ())
    cut = None if found is None else found.cut if tensor.requires_grad else found.made_by
    if reached and found is not None and found.emptied and tensor.grad is None:
        cut = _returned_none(path) or cut
    by_hand = _update_like(tensor) or bool(found and found.from_grad)  # w - lr * w.grad
    fresh = () if reached or by_hand else _fresh_of(output, tensor, modules)
    return Facts(
        tensor=_parametrized_name(fresh) if names[0] == "tensor" and fresh else names[0],
        output=names[1],
        dtype=tensor.dtype,
        requires_grad=tensor.requires_grad,
        is_leaf=tensor.is_leaf,
        retains_grad=tensor.retains_grad,
        grad_fn=type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else "",
        leaves_behind=_leaves_behind(tensor),
        copy_of_leaf=_one_leaf(tensor),
        update_like=by_hand,
        reached=reached,
        in_graph=in_graph,
        grad=tensor.grad if tensor.is_leaf or tensor.retains_grad else None,  # else it warns
        hooks=hooks,
        notes=notes,
        opaque=_opaque(path),
        compiled=any(type(node).__name__ == COMPILED_NODE for node in path),
        fresh_of=fresh,
        graphless=output.grad_fn is None and not output.requires_grad,
        registered=registered,
        trace=found,
        cut=cut,
    )


def _reached(output, tensor, targets, in_graph) -> bool:
    if tensor.grad_fn is not None:
        return (tensor.grad_fn, tensor.output_nr) in targets
    # a leaf: through its AccumulateGrad; an output that is itself a leaf
    return tensor.requires_grad and (in_graph or tensor is output)


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


def _one_leaf(tensor) -> bool:
    """Made in one step from one leaf alone, or with a number: .to(), a view, * 0.01.

    After a backward() has freed what the step saved, the number can no longer be told
    from a constant tensor; one leaf and a constant then counts as well.
    """
    if tensor.grad_fn is None:
        return False
    inputs = [node for node, _ in tensor.grad_fn.next_functions if node is not None]
    if len(inputs) != 1 or getattr(inputs[0], "variable", None) is None:
        return False
    if len(tensor.grad_fn.next_functions) == 1:
        return True
    try:  # w * 0.01 saves the number as a 0-dim tensor
        other = getattr(tensor.grad_fn, "_saved_other", None)
    except RuntimeError:  # freed by a backward() already: one leaf and a constant
        return True
    return isinstance(other, torch.Tensor) and other.dim() == 0


def _update_like(tensor) -> bool:
    """``w = w - lr * w.grad`` seen in the graph and the values: a sum or difference of
    one leaf and a constant, the constant a multiple of that leaf's ``.grad``."""
    node = tensor.grad_fn
    if type(node).__name__ not in ("SubBackward0", "AddBackward0"):
        return False
    inputs = [n for n, _ in node.next_functions]
    leaves = [getattr(n, "variable", None) for n in inputs if n is not None]
    if len(leaves) != 1 or leaves[0] is None or None not in inputs:
        return False
    leaf, grad = leaves[0], leaves[0].grad
    if grad is None or grad.shape != tensor.shape or not grad.any():
        return False
    step = (leaf - tensor).detach().flatten()
    flat = grad.flatten()
    scale = (step @ flat) / (flat @ flat)
    if scale == 0:
        return False
    # A step along the gradient: a multiple of it, or one that follows its sign
    # everywhere (a clipped or rescaled gradient: lr * w.grad.clamp(-1, 1)); a
    # constant offset (w - 0.5) is neither.
    signs = torch.sign(step) == torch.sign(scale) * torch.sign(flat)
    varies = step.unique().numel() > 1
    return torch.allclose(step, scale * flat) or bool(signs.all() and varies)


def _returned_none(path) -> Cut | None:
    """A recorded backward() ran through custom Functions and left the tensor's .grad None:
    their backward returned None for it (a Cut of kind "custom backward")."""
    nodes = [
        node
        for node in path
        if isinstance(node, torch.autograd.function.BackwardCFunction)
        and type(node).__name__ not in (MODULE_HOOK_NODE, COMPILED_NODE)
    ]
    named = sorted(
        {f"{node._forward_cls.__name__}.backward() (node {type(node).__name__})" for node in nodes}
    )
    if not named:
        return None
    region = " or ".join(sorted({node._forward_cls.__name__ for node in nodes}))
    return Cut(" or ".join(named), "custom backward", "", "", "", region=region)


def _opaque(nodes) -> tuple[str, ...]:
    """The custom autograd Functions among ``nodes`` (hook and compiled nodes aside)."""
    custom = [
        type(node).__name__
        for node in nodes
        if isinstance(node, torch.autograd.function.BackwardCFunction)
        and type(node).__name__ not in (MODULE_HOOK_NODE, COMPILED_NODE)
    ]
    return tuple(sorted(set(custom)))


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


def _fresh_of(output, tensor, modules) -> tuple[str, ...]:
    """A non-leaf that backward does not reach, made from leaves that it does reach.

    ``layer.weight`` under ``parametrizations.weight_norm`` is computed afresh on
    every read; the tensors that train are the leaves it is computed from.
    """
    if tensor.grad_fn is None:
        return ()
    mine = [getattr(n, "variable", None) for n in backward_nodes(tensor)]
    graph = {id(getattr(n, "variable", None)) for n in backward_nodes(output)}
    reached = [leaf for leaf in mine if leaf is not None and id(leaf) in graph]
    return tuple(sorted(parameter_name(leaf, modules) for leaf in reached))


def _parametrized_name(fresh: tuple[str, ...]) -> str:
    """``layer.weight`` for a tensor made from ``layer.parametrizations.weight.original0``."""
    match = re.fullmatch(r"(.*)\.parametrizations\.(\w+)\.original\d*", fresh[0])
    return f"{match[1]}.{match[2]}" if match else "tensor"


def parameter_name(tensor, modules: dict) -> str:
    """``layer.parametrizations.weight.original0``, or the tensor described."""
    for prefix, module in modules.items():
        for name, p in module.named_parameters(remove_duplicate=False):
            if p is tensor:
                return f"{prefix}.{name}" if prefix else name
    return f"a {tensor.dtype} leaf of shape {tuple(tensor.shape)}"


# ---------------------------------------------------------------------------
# Hooks that can change the tensor's gradient.


def _hooks(output, tensor, path, recording, names, modules) -> tuple[tuple, tuple]:
    tensor_hooks = _tensor_hooks(output, tensor, path, recording, names)
    module_hooks, notes = _module_hooks(tensor, path, recording, modules)
    return tuple(dict.fromkeys(tensor_hooks + module_hooks)), notes


def _tensor_hooks(output, tensor, path, recording, names) -> list[str]:
    """Hooks on tensors on the path: PyTorch lists a computed tensor's on itself only,
    so hooks on intermediate results are found through the recording."""
    seen = [(tensor, names[0]), (output, names[1])]
    if recording is not None:
        for state in recording.states:
            if state.tensor.grad_fn in path and all(state.tensor is not t for t, _ in seen):
                seen.append((state.tensor, name_of(recording, state.tensor) or "an unnamed result"))
    found = [
        f"{h} on {name}"
        for t, name in seen
        if t is tensor or t.grad_fn in path
        for h in hooks_on(t)
    ]
    if recording is not None:
        found += [
            text
            for note in recorder.hook_notes(recording)
            if (text := _noted_hook(recording, note, tensor, path, names))
        ]
    return found


def _noted_hook(recording, note, tensor, path, names) -> str:
    """A recorded ``register_hook``, if it runs on the way; one put on a value later
    changed in place stays with the value before that change."""
    state = recording.states[note.state]
    on_path = state.grad_fn in path if state.grad_fn is not None else state.tensor is tensor
    if note.removed or not on_path:
        return ""
    name = name_of(recording, state.tensor) or (
        names[0] if state.tensor is tensor else "an unnamed result"
    )
    newest = recording.states[recording.state_of(state.tensor)]
    later = newest.in_place[len(state.in_place) :]
    text = f"hook {hook_name(note.hook)} on {name}"
    if later:
        changes = ", ".join(f"{op}()" for op in later)
        text += f" (registered before {changes}: it gets the gradient of {name} before that change)"
    return text


def _module_name(module, modules: dict) -> str:
    for name, known in modules.items():
        if known is module:
            return name or type(module).__name__
    return f"a {type(module).__name__}"


def _owner(tensor, modules: dict):
    """The module whose own (not a child's) parameter ``tensor`` is, if known."""
    for module in modules.values():
        if any(p is tensor for p in module.parameters(recurse=False)):
            return module
    return None


def _holders(tensor, modules: dict) -> list:
    """The modules that hold ``tensor`` as a parameter, their own or a child's: the
    module itself and every container around it (each once)."""
    found = {}
    for module in modules.values():
        if any(p is tensor for p in module.parameters()):
            found.setdefault(id(module), module)
    return list(found.values())


def _hooked(module) -> bool:
    return bool(module._backward_hooks or module._backward_pre_hooks)


def _module_hooks(tensor, path, recording, modules) -> tuple[list[str], tuple[str, ...]]:
    """Module backward hooks on the way, and notes on the modules that hold the tensor.

    A full backward hook runs at the node around the module's inputs, and
    changes only what goes on to them; a pre-hook runs at the node around its
    outputs, before the parameters inside the module get theirs. A recording says
    which node is which. Without one: a module that holds the tensor (its own
    module, or a container around it) puts only its output's node on the path, so
    when the hook nodes on the path are exactly one per such hooked module, only
    their pre-hooks can change the gradient; otherwise the tool cannot tell.
    """
    nodes = {n for n in path if type(n).__name__ == MODULE_HOOK_NODE}
    calls = list(recorder.module_calls(recording).values()) if recording is not None else []
    found = []
    for call in calls:
        name = _module_name(call.module, modules)
        if call.input_node in nodes:
            found += [f"full backward hook {hook_name(h)} on {name}" for h in call.hook.user_hooks]
        if call.output_node in nodes:
            found += [
                f"backward pre-hook {hook_name(h)} on {name}" for h in call.hook.user_pre_hooks
            ]
    unseen = nodes - {n for c in calls for n in (c.input_node, c.output_node)}
    holders = [m for m in _holders(tensor, modules) if _hooked(m)]
    if unseen and holders and len(unseen) == len(holders):
        for module in holders:  # each node is a holder's output's: pre-hooks only
            name = _module_name(module, modules)
            hooks = module._backward_pre_hooks.values()
            found += [f"backward pre-hook {hook_name(h)} on {name}" for h in hooks]
    elif unseen:
        found.append("a module's backward hook (register_full_backward_hook or its pre-hook)")
    return found, _holder_notes(tensor, holders, calls, modules)


def _holder_notes(tensor, holders, calls, modules) -> tuple[str, ...]:
    notes = []
    own = _owner(tensor, modules)
    for module in holders:
        if not module._backward_hooks:
            continue
        name = _module_name(module, modules)
        inside = (
            f"{name}'s own parameters get" if module is own else f"parameters inside {name} get"
        )
        notes.append(
            f"{name}'s full backward hook (register_full_backward_hook) cannot change this "
            f"gradient: it gets grad_input, the gradient for {name}'s inputs, and what it "
            f"returns goes only to them; {inside} theirs from grad_output (a backward "
            "pre-hook, register_full_backward_pre_hook, can change that)"
        )
        if any(c.module is module and c.hook.input_tensors_index is None for c in calls):
            notes.append(
                f"{name}'s input did not require grad, so its full backward hook gets "
                "grad_input == (None,) and may return only None (PyTorch warns 'Full backward "
                "hook is firing when gradients are computed with respect to module outputs "
                "since no inputs require gradients'): there is no gradient for that input"
            )
    return tuple(notes)
