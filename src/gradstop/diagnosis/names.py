"""What the sentences call a tensor: the recording's names, the caller's, a model's."""

from __future__ import annotations

import torch

from ..forward import Recording
from ..graph import backward_nodes


def names(output, tensor, recording: Recording | None, caller) -> tuple[str, str]:
    """What the sentences call the two tensors: the recording's or the caller's names."""
    found = []
    for obj, fallback in ((tensor, "tensor"), (output, "output")):
        name = None
        if recording is not None and any(s.tensor is obj for s in recording.states):
            name = recording.names.get(id(obj))
        if name is None:
            name = local_name(obj, caller.f_locals, caller.f_globals) or fallback
        found.append(name)
    return found[0], found[1]


def local_name(obj, local: dict, shared: dict) -> str | None:
    """The caller's one variable holding ``obj``, or ``model.weight`` for a parameter.

    A parameter is named after a module among the caller's variables (local
    first, then global).
    """
    bound = [k for k, v in local.items() if v is obj and is_name(k)]
    if len(bound) == 1:
        return bound[0]
    for k, v in [*local.items(), *shared.items()]:
        if isinstance(v, torch.nn.Module) and is_name(k):
            for name, p in v.named_parameters(remove_duplicate=False):
                if p is obj:
                    return k + attribute_path(name)
    return None


def known_modules(caller) -> dict[str, torch.nn.Module]:
    """Every module the caller's variables hold, by the name Python reaches it with."""
    found: dict[str, torch.nn.Module] = {}
    for k, v in [*caller.f_locals.items(), *caller.f_globals.items()]:
        if isinstance(v, torch.nn.Module) and is_name(k):
            for name, module in v.named_modules(remove_duplicate=False):
                found.setdefault(k + attribute_path(name) if name else k, module)
    return found


def attribute_path(name: str) -> str:
    """A parameter's dotted name as Python spells the access: "0.gain" -> "[0].gain".

    A number indexes (nn.Sequential, nn.ModuleList), a name is an attribute,
    anything else a key (nn.ModuleDict).
    """
    parts = name.split(".")
    return "".join(
        f"[{p}]" if p.isdigit() else f".{p}" if p.isidentifier() else f"[{p!r}]" for p in parts
    )


def is_name(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


def loose_tensors(model: torch.nn.Module) -> dict[int, tuple[str, torch.Tensor]]:
    """Tensors that require grad held by ``model`` but not registered as its parameters.

    A layer in a plain Python list or dict (not nn.ModuleList, nn.ModuleDict) and a
    tensor attribute that is not an nn.Parameter are invisible to
    ``model.parameters()``. Keyed by id(); each with the name Python reaches it by.
    """
    registered = {id(p) for p in model.parameters()}
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            where = f"{prefix}.{attr}" if prefix else attr
            for name, t in _tensors_held(where, value):
                if t.requires_grad and id(t) not in registered:
                    found.setdefault(id(t), (name, t))
    return found


def _tensors_held(where: str, value) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(where, value)]
    if isinstance(value, torch.nn.Module):
        return [(where + attribute_path(n), p) for n, p in value.named_parameters()]
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, (list, tuple))
        else ()
    )
    return [
        found
        for key, item in items
        for found in _tensors_held(
            f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]", item
        )
    ]


def outside_leaves(losses, known: set[int], caller) -> list[tuple[str, torch.Tensor]]:
    """Leaves that require grad, that backward() from ``losses`` reaches, and that are
    not among ``known`` (the model's parameters and the tensors it holds) nor
    parameters of another module the caller holds: a global or a closure variable
    the forward pass reads. Each named by the caller's variable holding it, or
    described.
    """
    found: dict[int, tuple[str, torch.Tensor]] = {}
    # A parameter of another module the caller holds (a copy of the model) is that
    # module's: the model's own rows then say it is not used.
    others = {
        id(p) for m in (known_modules(caller) if caller else {}).values() for p in m.parameters()
    }
    known = known | others
    for loss in losses:
        if loss.grad_fn is None:
            continue
        for node in backward_nodes(loss):
            t = getattr(node, "variable", None)
            if not isinstance(t, torch.Tensor) or id(t) in known or id(t) in found:
                continue
            name = _bound_name(t, caller) if caller else None
            shape = tuple(t.shape)
            found[id(t)] = (name or f"a leaf of shape {shape} outside the model", t)
    return list(found.values())


def _bound_name(obj, caller) -> str | None:
    """The caller's variable holding ``obj``: a local, else a global (each the only one)."""
    name = local_name(obj, caller.f_locals, caller.f_globals)
    if name is not None:
        return name
    bound = [k for k, v in caller.f_globals.items() if v is obj and is_name(k)]
    return bound[0] if len(bound) == 1 else None
