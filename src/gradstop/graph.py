"""Reading autograd's backward graph: one walk, and what the book reads from it.

A tensor made by an operation carries ``grad_fn``, the backward node that will
send its gradient on; each node lists in ``next_functions`` the nodes it sends
gradient to. ``backward_edges`` walks those links once, without recursion, and
everything else here (and in the pictures) is read from that walk.

These are PyTorch internals (``next_functions``, ``_backward_hooks``): fine for
looking at a graph, not for production code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class BackwardEdge(NamedTuple):
    """One link of the backward graph: ``target`` sends gradient to ``source``.

    Read in the forward direction, ``source`` made an input of the operation
    whose backward node is ``target`` (torchviz draws the arrow that way).
    ``output_nr`` says which of ``source``'s outputs that input was.
    """

    source: object
    output_nr: int
    target: object


def backward_edges(output: torch.Tensor) -> list[BackwardEdge]:
    """Every edge of the backward graph behind ``output``, in walk order.

    An input used twice by one operation (``y * y``) gives two edges. The walk
    keeps its own stack, so a graph thousands of nodes deep is fine.
    """
    if output.grad_fn is None:
        return []
    edges, seen, stack = [], set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for source, output_nr in node.next_functions:
            if source is not None:
                edges.append(BackwardEdge(source, output_nr, node))
                stack.append(source)
    return edges


def backward_nodes(output: torch.Tensor) -> set:
    """The backward nodes reachable from ``output`` (what torchviz draws as grey boxes)."""
    if output.grad_fn is None:
        return set()
    return {output.grad_fn} | {edge.source for edge in backward_edges(output)}


def grad_fn_names(output: torch.Tensor) -> list[str]:
    """Sorted type names of the backward nodes reachable from ``output``."""
    return sorted(type(node).__name__ for node in backward_nodes(output))


def gradient_targets(output: torch.Tensor) -> set[tuple[object, int]]:
    """The (backward node, output number) pairs that backward() from ``output`` reaches.

    A computed tensor receives gradient exactly when its own ``(grad_fn,
    output_nr)`` is in this set; a leaf, when its ``AccumulateGrad`` node is.
    """
    if output.grad_fn is None:
        return set()
    reached = {(output.grad_fn, output.output_nr)}
    return reached | {(edge.source, edge.output_nr) for edge in backward_edges(output)}


def hook_name(hook) -> str:
    """How pictures name a hook: its function's name, or the call that made it.

    Hooks made by one factory, ``save_grad('p1')`` and ``save_grad('z1')`` each
    returning an inner ``hook``, share a function name; they are told apart by
    the factory and the plain values (str, number) their closure holds.
    """
    name = getattr(hook, "__name__", None) or type(hook).__name__
    qualname = getattr(hook, "__qualname__", name)
    values = [_contents(cell) for cell in getattr(hook, "__closure__", None) or ()]
    shown = [repr(v) for v in values if isinstance(v, (str, int, float))]
    if ".<locals>." not in qualname or not shown:
        return name
    factory = qualname.split(".<locals>.")[-2].rsplit(".", 1)[-1]
    return f"{factory}({', '.join(shown)})"


def _contents(cell) -> object:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return None


def hooks_on(tensor: torch.Tensor) -> list[str]:
    """The hooks registered on ``tensor`` now, named, in the order they will run."""
    hooks = getattr(tensor, "_backward_hooks", None) or {}
    after = getattr(tensor, "_post_accumulate_grad_hooks", None) or {}
    return [f"hook {hook_name(h)}" for h in hooks.values()] + [
        f"post-accumulate hook {hook_name(h)}" for h in after.values()
    ]
