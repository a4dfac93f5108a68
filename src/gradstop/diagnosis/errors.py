"""What an error raised inside ``diagnose_step`` means, and its fix.

The errors readers meet around backward(), each keyed by the start of PyTorch's
message. For "modified by an inplace operation" the recording also names the
tensor and the in-place operation that changed it after it was used.
"""

from __future__ import annotations

import re

import torch

from ..forward import Recording
from .recorded import name_of, op_text

EXPLAINED = {
    "element 0 of tensors does not require grad": "the loss has no graph behind it; the "
    "rows below say which operation made it so",
    "Trying to backward through the graph a second time": "an earlier backward() freed the "
    "values this graph saved for its gradient. Compute the forward pass again each step, "
    "and detach what is carried from one step to the next (an RNN's hidden state, "
    "h = h.detach(), and for an LSTM's (h, c) each of the two, "
    "tuple(t.detach() for t in hidden); a GAN's fake batch in the discriminator's step, "
    "D(fake.detach())). retain_graph=True keeps those values, but a second backward then "
    "reuses what was saved for the old weights: after an optimizer.step() it raises "
    "'modified by an inplace operation' (after a fused step, fused=True, nothing), or "
    "quietly gives the old forward pass's gradient",
    "one of the variables needed for gradient computation has been modified by an "
    "inplace operation": "a tensor saved for the gradient was changed in place before "
    "backward() used it. Use the out-of-place form (x = x * 2 instead of x *= 2, "
    "ReLU without inplace=True), or change a clone(); after an optimizer.step(), compute "
    "the forward pass again rather than a second backward() through the old graph",
    "a leaf Variable that requires grad is being used in an in-place operation": "a "
    "parameter was changed in place while autograd records: do the update under "
    "torch.no_grad() (with torch.no_grad(): w -= lr * w.grad), or use an optimizer",
    "grad can be implicitly created only for scalar outputs": "backward() without an "
    "argument needs a single number: reduce the output first (loss.mean(), loss.sum()), "
    "or pass a gradient of its shape, out.backward(torch.ones_like(out))",
    "can't optimize a non-leaf Tensor": "the optimizer was given a computed tensor, not a "
    "leaf (requires_grad=True, then .to(), .cuda(), * 2): create the leaf last, in its "
    "final form, then give it to the optimizer",
    "Only Tensors of floating point and complex dtype can require gradients": "an integer "
    "or boolean tensor cannot require grad: make it floating-point first (.float())",
    "Can't call numpy() on Tensor that requires grad": "a NumPy array carries no graph: keep "
    "the computation in torch operations; detach().numpy() is right only where no "
    "gradient is needed",
    # "…": one word that varies, here the custom Function's backward node
    "function … returned an incorrect number of gradients": "a custom autograd Function's "
    "backward() must return one value per argument its forward() took after ctx, in "
    "order: None for an argument that is not a tensor or needs no gradient (a gradient "
    "reversal's alpha: return -alpha * grad, None)",
    "Function … returned an invalid gradient at index": "a custom autograd Function's "
    "backward() returned, for the input at that index (0 is forward()'s first argument "
    "after ctx), a gradient whose shape is not the input's: return each gradient shaped "
    "like its input (for a weight w of shape [out, in] used as x @ w.t(), that is "
    "grad_out.t() @ x), then check with torch.autograd.gradcheck",
    "optimizer got an empty parameter list": "the optimizer was handed no parameters: an "
    "iterator (model.parameters(), filter(...), a generator) that something had already "
    "used up, such as a count of its items, or a list left empty by a filter; pass a list, "
    "params = list(...), and give the optimizer that",
    "Inference tensors cannot be saved for backward": "a value made under inference_mode() "
    "was used where autograd must save it: compute it outside inference_mode() if it "
    "should train, or use no_grad() and clone() if not",
}
_NONE = re.compile(r"'NoneType' object has no attribute|operand type\(s\) for .*'NoneType'")
_SAVED = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\]")
_VERSIONS = re.compile(r"is at version (\d+); expected version (\d+)")


def explain(error: str, recording: Recording, modules: dict) -> str:
    """What ``error`` means and how to fix it ("" for an error this does not know)."""
    if _NONE.search(error):
        return "a .grad was None where a gradient was expected; the rows below say why"
    for start, text in EXPLAINED.items():
        if _starts(error, start):
            culprit = _in_place_culprit(error, recording, modules) if "inplace" in start else ""
            if start.startswith("element 0"):
                culprit = _graphless_gradient(recording)
            if start.startswith("Trying to backward through the graph a second time"):
                culprit = _carried_in(recording)
            return text + culprit
    return ""


def _graphless_gradient(recording: Recording) -> str:
    """A torch.autograd.grad() whose result has no graph (no create_graph=True)."""
    from .recorder import grad_calls

    for call in grad_calls(recording):
        made = [recording.states[i].tensor for i in call.outputs]
        if made and all(t.grad_fn is None for t in made):
            where = f" ({call.where})" if call.where else ""
            return (
                f". Here: torch.autograd.grad(){where} ran without create_graph=True, so "
                "the gradient it returned has no graph, and differentiating it again (a "
                "second derivative, a gradient penalty) raises this: pass "
                "create_graph=True to that call, and to each call whose result is "
                "differentiated again"
            )
    return ""


def carried(names: dict, model=None) -> dict[int, tuple]:
    """The tensors that still hold a graph when a step starts: among ``names`` (a
    frame's variables: an RNN's state, "h" or "state[0]" in a tuple) and the attributes
    of ``model``'s modules (a cached result, "_prototypes"). {id: (name, tensor, owner)},
    ``owner`` the module holding it (None for a variable)."""
    found: dict[int, tuple] = {}
    for name, value in names.items():
        if name.startswith("_"):
            continue
        items = value if isinstance(value, (tuple, list)) and len(value) <= 4 else (value,)
        for i, t in enumerate(items):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                found.setdefault(id(t), (name if items is not value else f"{name}[{i}]", t, None))
    for prefix, module in model.named_modules() if model is not None else ():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                where = f"{prefix}.{attr}" if prefix else attr
                found.setdefault(id(value), (where, value, (module, attr)))
    return found


def _carried_in(recording: Recording) -> str:
    """The tensors that came into the block with an earlier step's graph, and were used."""
    before = recording.notes.get("carried", {})
    used = {id(recording.states[i].tensor) for call in recording.calls for i in call.inputs}
    kept = [before[i] for i in used if i in before and _still_held(*before[i])]
    if kept:
        return _reused_text(kept)
    named = sorted({before[i][0] for i in used if i in before})
    if not named:
        return ""
    whole = sorted({n.split("[")[0] for n in named})
    fix = ", ".join(
        f"{w} = tuple(t.detach() for t in {w})"
        if f"{w}[0]" in named or f"{w}[1]" in named
        else f"{w} = {w}.detach()"
        for w in whole
    )
    it, is_ = ("them", "they are") if len(named) > 1 else ("it", "it is")
    return (
        f". Here: {', '.join(named)} came into this step still holding an earlier step's "
        f"graph (a grad_fn), and this step used {it}, so backward() went on into the part of "
        f"that graph the earlier backward() freed: detach {it} where {is_} carried over, "
        f"before the forward pass ({fix})"
    )


def _still_held(name: str, tensor, owner) -> bool:
    """Is the carried tensor still where it was (a cache), not replaced by the step?"""
    return owner is not None and getattr(owner[0], owner[1], None) is tensor


def _reused_text(kept: list) -> str:
    names = " and ".join(sorted(name for name, _, _ in kept))
    return (
        f". Here: {names}, held by the model, was computed in an earlier step and kept "
        "(it is the same tensor "
        "now), with that step's graph, which that step's backward() freed: compute it again "
        "in each step, inside the forward pass. Detaching it would silence the error but "
        "stop the gradient from reaching what it is computed from"
    )


def _starts(error: str, start: str) -> bool:
    """Does ``error`` begin with ``start``, "…" in it standing for one word that varies?"""
    if "…" not in start:
        return error.startswith(start)
    pattern = r"\S+".join(re.escape(part) for part in start.split("…"))
    return re.match(pattern, error) is not None


def _in_place_culprit(error: str, recording: Recording, modules: dict) -> str:
    """The tensor an operation saved, then changed in place: matched by its memory, the
    saved tensor's shape and the version the error reports (a shape alone can match a
    weight nothing saved). Anomaly mode where the recording cannot tell."""
    match = _SAVED.search(error)
    if match is None:
        return ""
    shape = [int(n) for n in match[1].split(",") if n.strip()]
    versions = _VERSIONS.search(error)
    found = _saved_then_changed(recording, shape, int(versions[1]) if versions else None)
    if found is None:
        return (
            ". To find the operation, run the forward and the backward pass under "
            "torch.autograd.set_detect_anomaly(True): its warning names the forward line "
            "of the operation whose saved tensor was changed"
        )
    changed, write, user = found
    name = _name(changed, recording, modules)
    saved = name if list(changed.shape) == shape else f"{name} (a view of it, shape {shape})"
    what = op_text(write.name) + (f" (in {write.where})" if write.where else "")
    return (
        f". Here: {user}() saved {saved}; then {what} wrote to it, before backward() read "
        f"it: give {user}() a copy ({name}.clone()), or make the change after backward()"
    )


def _saved_then_changed(recording: Recording, shape: list[int], version: int | None):
    """(tensor, in-place call, user's name): a tensor of ``shape`` that an operation
    recording a graph took, whose memory a later in-place call then wrote."""
    states, users = recording.states, []  # (storage, shape, name) of what could be saved
    for call in recording.calls:
        outputs = [states[o].tensor for o in call.outputs]
        inputs = [states[i].tensor for i in call.inputs]
        written = [t for t in outputs if any(t is x for x in inputs)] + list(call.wrote)
        for t in written:
            memory = _memory(t)
            if version is not None and t._version != version:
                continue
            for storage, used_shape, user in users:
                if storage == memory and sorted(used_shape) == sorted(shape):  # or a .t()
                    return t, call, user
        view = all(_memory(o) in {_memory(t) for t in inputs} for o in outputs)  # t(), view()
        if call.grad_enabled and not written and not view and any(t.requires_grad for t in outputs):
            # what a backward may need: the inputs, or the output (sigmoid, exp, tanh)
            users += [(_memory(t), list(t.shape), call.name) for t in inputs + outputs]
    return None


def _memory(tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and other layouts
        return None


def _name(tensor, recording: Recording, modules: dict) -> str:
    for prefix, module in modules.items():
        held = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, p in held:
            if p is tensor:
                return f"{prefix}.{name}" if prefix else name
    return name_of(recording, tensor) or f"a tensor of shape {tuple(tensor.shape)}"
