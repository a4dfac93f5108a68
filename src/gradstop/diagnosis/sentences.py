"""One sentence per reason: the cause, in PyTorch's terms, and the fix a maintainer gives.

``sentence(reason, facts)`` fills the reason's template from the facts: the
names, the operation that cut the path and the reader's line that ran it, the
hooks on the way, the other uses of the tensor, the backward call that ran.
"""

from __future__ import annotations

import re

from .facts import Facts
from .recorded import Cut
from .rules import Reason

SENTENCES = {
    Reason.OK: "backward() from {output} reaches {tensor}, and {tensor}.grad holds a "
    "gradient (the sum over every backward() since it was last reset){zeros}{compiled}.",
    Reason.NOT_YET: "the graph of {output} reaches {tensor}, but {tensor}.grad is None "
    "because no backward() has filled it since it was made or reset (optimizer.zero_grad() "
    "sets None){not_yet}: read it after a backward() through this path and before the next "
    "zero_grad() (torch.autograd.grad() and backward(inputs=...) fill no .grad for tensors "
    "they were not asked about).",
    Reason.HOOKED: "backward() from {output} reaches {tensor} through {hooks}, and what a hook "
    "returns replaces the gradient it was given: if {tensor}.grad is wrong (zeros, scaled), "
    "fix what the hook returns, or remove it with the handle that registering it returned "
    "(handle.remove()).",
    Reason.PARTIAL: "backward() from {output} reaches {tensor}, but not along every path: "
    "{lost}; so {tensor}.grad holds only part of the gradient of {output}. If that cut is "
    "meant (a stop-gradient, a target), this is right; if not, {lost_fix}. The recorded "
    "uses of {tensor}: {uses}.",
    Reason.NOT_ACCUMULATED: "backward() from {output} reaches {tensor}, but the backward call "
    "recorded fills no .grad for it: {passes}.",
    Reason.UNREGISTERED: "backward() from {output} reaches {tensor}, but {tensor} is not a "
    "registered parameter of the model (a layer kept in a plain Python list or dict, a "
    "tensor attribute that is not an nn.Parameter, a buffer made with register_buffer, or "
    "a global the forward pass reads): "
    "model.parameters() does not list it, so "
    "an optimizer built from it never changes {tensor}, and state_dict(), .to() and "
    "zero_grad() miss it. {unregistered_fix} (if it is an input whose gradient you want, "
    "this is fine).",
    Reason.NON_LEAF: "{tensor} is not a leaf (grad_fn={grad_fn}{behind}), so backward() "
    "passes its gradient on without keeping it: {non_leaf_fix}.",
    Reason.NOT_FLOAT: "{tensor} has dtype {dtype}, and only floating-point and complex "
    "tensors can have gradients: make it a float tensor (.float()) before it is used.",
    Reason.NO_REQUIRES_GRAD: "{tensor} has requires_grad=False, so autograd computes no "
    "gradient for it: create it with requires_grad=True, or call {tensor}.requires_grad_() "
    "before the forward pass (if it is a copy of another tensor, record the forward pass "
    "to see what made it){graphless}.",
    Reason.SWITCHED_OFF: "{tensor} required grad when {output} was computed, but was "
    "switched off afterwards (detach_() or requires_grad_(False)), and backward() then "
    "skips it without a word: to train it on this step and freeze it from the next, "
    "switch it off after backward(); to freeze it now, before the forward pass.",
    Reason.LATE_REQUIRES_GRAD: "{tensor} did not require grad when the forward pass used "
    "it, and switching it on afterwards does not change what was recorded: set "
    "requires_grad=True before computing {output}{graphless}.",
    Reason.DETACHED: "{cut}, and detach() returns the same values with no graph{graphless}: "
    "{detach_fix}.",
    Reason.DATA: "{cut}{data_why}{graphless}: {data_fix}.",
    Reason.NO_GRAD: "{cut}, which ran with gradient recording off ({mode}){graphless}: "
    "compute it outside that region (a function or forward decorated with "
    "@torch.no_grad() cannot train what it computes).",
    Reason.CHECKPOINTED: "{cut}, inside torch.utils.checkpoint.checkpoint with "
    "use_reentrant=True, which runs its block under no_grad() and gives gradients only "
    "through block inputs that require grad; none did, so nothing inside gets one "
    "(PyTorch warns 'None of the inputs have requires_grad=True. Gradients will be "
    "None'){graphless}: pass use_reentrant=False (or give the block an input that "
    "requires grad).",
    Reason.COPIED: "{cut}, which copies the values into a new tensor with no graph"
    "{graphless}: to combine tensors use torch.stack or torch.cat (not torch.tensor, "
    "torch.as_tensor, torch.Tensor or x.new_tensor on a list of tensors); to use a value, "
    "use the tensor itself; no nn.Parameter around a computed value.",
    Reason.NOT_DIFFERENTIABLE: "{cut}, {flat}{graphless}: {stand_in}.",
    Reason.LEFT_TORCH: "no recorded operation carries {tensor} to {output}: its values left "
    "PyTorch through {exits}, and a Python number or NumPy array carries no graph{graphless}. "
    "{left_fix}",
    Reason.RECOMPUTED: "{tensor} is computed afresh from {fresh} each time it is read (a "
    "parametrization such as nn.utils.parametrizations.weight_norm or spectral_norm, or a "
    "property): the tensor you hold is not the one {output} used, and gets no gradient. "
    "The tensors that train are {fresh}: read their .grad, and put hooks on them.",
    Reason.UNUSED: "no recorded operation used {tensor}, so, if the recording covers the "
    "whole forward pass, {output} does not depend on it (a layer never called, a branch not "
    "taken, a copy of the model used instead){graphless}: compute {output} from it, or leave "
    "it out of the optimizer.",
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
    "itself, such as a flat step like round(), a clamp() past its bound or a ReLU that is "
    "off for every input, or at a zero_grad(set_to_none=False) with no backward() since)"
)

_ZEROS_UNSEEN = (
    " (all zeros: a flat step on the path, such as round(), a clamp() past its bound or a "
    "ReLU that is off for every input, a zero_grad(set_to_none=False) with no backward() "
    "since, or a hook on an intermediate result could do that; those hooks are seen only "
    "with recording=rec)"
)

_COMPILED_OK = (
    "; it passed through torch.compile'd code, whose inside the graph does not show, so a "
    "cut or a hook in there would not be seen"
)

_COMPILED = (
    "{output} was computed through torch.compile'd code (CompiledFunctionBackward), whose "
    "inside the graph does not show, so this tool cannot tell whether or how backward() "
    "reaches {tensor}: ask again about the model run uncompiled (torch.compile(model) wraps "
    "it as model._orig_mod), then apply the fix to both."
)

_OPAQUE = (
    "the graph of {output} shows no path to it, but backward() also runs {opaque}, a "
    "custom autograd Function whose backward the graph cannot see into (reentrant "
    "checkpointing is one): it may reach {tensor} from there, or not; look at "
    "{tensor}.grad after backward(), or record the forward pass and ask again."
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

_LEFT_EITHER = (
    "If that value was used to compute {output}, keep that computation in torch operations "
    "(to make one tensor of several, torch.stack(list) or torch.cat(list), never "
    "torch.tensor(list), torch.Tensor(list) or a number's .item()); "
    "if it was only logged or printed, nothing from {tensor} reaches {output} (a loss term "
    "computed and never added): add it to {output}."
)

_LEFT_AND_BACK = (
    "Those numbers came back as a new tensor, with their values and no graph, and it "
    "reaches {output}: {round_trip}. Build that tensor from {tensor} with torch operations "
    "(torch.cos(t), not math.cos(t), t.item() or NumPy) and put the "
    "pieces together with torch.stack(list) or torch.cat(list), never torch.tensor() of "
    "numbers: keep it a tensor all the way from {tensor} to {output}."
)

_GRAPHLESS = (
    "; nothing else {output} was computed from requires grad either, so {output}.backward() "
    "raises 'element 0 of tensors does not require grad and does not have a grad_fn'"
)


def sentence(reason: Reason, f: Facts) -> str:
    """The plain sentence for ``reason``, filled in from the facts; notes after it."""
    fields = _fields(f)
    if reason is Reason.UNDECIDED:
        fields["undecided"] = _undecided(f).format(**fields, opaque=" and ".join(f.opaque))
    text = SENTENCES[reason].format(**fields)
    return " ".join([text, *(f"Note: {note}." for note in f.notes)])


def _fields(f: Facts) -> dict[str, str]:
    trace, cut = f.trace, f.cut
    zeros = f.grad is not None and f.grad.numel() > 0 and not f.grad.any()
    return {
        "tensor": f.tensor,
        "output": f.output,
        "grad_fn": f.grad_fn,
        "dtype": str(f.dtype),
        "hooks": ", ".join(f.hooks),
        "exits": " then ".join(trace.exits) if trace else "",
        "cut": _cut_text(cut, f) if cut else "",
        "flat": _flat_text(cut, f) if cut else "",
        "stand_in": _stand_in(cut),
        "mode": cut.mode if cut else "",
        "zeros": (_ZEROS_SEEN if trace else _ZEROS_UNSEEN) if zeros and not f.hooks else "",
        "compiled": _COMPILED_OK if f.compiled else "",
        "not_yet": _not_yet_text(f),
        "behind": _behind_text(f.leaves_behind),
        "non_leaf_fix": _non_leaf_fix(f),
        "graphless": _GRAPHLESS.format(output=f.output) if f.graphless else "",
        "lost": _lost_text(f),
        "lost_fix": _lost_fix(f),
        "uses": "; ".join(trace.uses) if trace else "",
        "passes": _passes_text(f),
        "fresh": " and ".join(f.fresh_of),
        "left_fix": _left_fix(f),
        "unregistered_fix": _unregistered_fix(f.tensor),
        "data_fix": _data_fix(cut),
        "detach_fix": _STATE_DICT_FIX if _in_state_dict(cut) else _DETACH_FIX,
        "data_why": "" if _assigned(cut) else _DATA_WHY,
    }


_DETACH_FIX = (
    "use the tensor itself where the gradient should flow (keep detach() only where you "
    "mean to stop it)"
)
_STATE_DICT_FIX = (
    "state_dict() hands out detached tensors (it is for saving, not computing): take the "
    "parameters themselves, model.named_parameters() or model.parameters() (or "
    "state_dict(keep_vars=True))"
)


def _in_state_dict(cut: Cut | None) -> bool:
    return cut is not None and cut.kind == "detach" and "state_dict(" in cut.where


_DATA_WHY = (
    ", and .data returns the same values with no graph (and hides in-place changes from autograd)"
)


def _assigned(cut: Cut | None) -> bool:
    return cut is not None and cut.op.startswith("an assignment to .data")


def _data_fix(cut: Cut | None) -> str:
    if _assigned(cut):
        return (
            "to run a module with computed weights, call it with them, "
            "torch.func.functional_call(module, {name: tensor}, inputs), instead of writing "
            "them into its parameters"
        )
    return "use the tensor itself, or detach() where you mean to stop the gradient"


def _unregistered_fix(name: str) -> str:
    """The container that registers it, read from its name: layers[0].weight, ws[1], w."""
    if re.search(r"[\]]\.", name):  # a parameter of a layer kept in a list or dict
        return "Keep the layers in nn.ModuleList (a dict of them: nn.ModuleDict)"
    if "[" in name:  # the tensor itself is an item of a list or dict
        return (
            "Keep the tensors in nn.ParameterList (a dict of them: nn.ParameterDict); it "
            "makes each an nn.Parameter"
        )
    return (
        "Assign it as an nn.Parameter attribute of the module (self.w = nn.Parameter(...)); "
        "a tensor that is not trained but should move with the model: register_buffer"
    )


def _left_fix(f: Facts) -> str:
    """The fix for values that left PyTorch: definite when a tensor made from them came back."""
    if f.trace is not None and f.trace.round_trip:
        return _LEFT_AND_BACK.format(
            tensor=f.tensor, output=f.output, round_trip=f.trace.round_trip
        )
    return _LEFT_EITHER.format(tensor=f.tensor, output=f.output)


def _behind_text(leaves: tuple[str, ...]) -> str:
    if not leaves:
        return ""
    return f"; computed in one operation from {' and '.join(leaves)}, whose .grad backward() fills"


def _flat_text(cut: Cut, f: Facts) -> str:
    if cut.kind == "autograd.grad":
        return (
            "which returns the gradients as tensors with no graph of their own unless it is "
            "given create_graph=True, so nothing computed from a gradient (a gradient "
            "penalty, a second derivative) can be differentiated again"
        )
    if cut.kind == "custom backward":
        return (
            f"the backward of a custom autograd Function: the recorded backward() from "
            f"{f.output} ran through it and left {f.tensor}.grad None, so it returned None "
            f"for the input that carries the gradient of {f.tensor} (None tells autograd "
            "that input gets no gradient)"
        )
    if cut.kind == "integer result":
        return (
            f"which returns a {cut.dtype} tensor, and integer and boolean results carry no gradient"
        )
    if cut.kind == "custom Function":
        return (
            f"inside the forward of {cut.region}, a custom autograd Function, which runs "
            "with recording off: PyTorch sends gradient through it only to the inputs given "
            "to apply(), from its backward (a tensor it uses without being given it gets none, "
            "unless that backward runs a backward of its own, as reentrant checkpointing does), "
            "and a result it marks non-differentiable carries none"
        )
    return f"and PyTorch has no derivative for {cut.op}, so its result carries no graph"


def _stand_in(cut: Cut | None) -> str:
    if cut is not None and cut.kind == "autograd.grad":
        return (
            "pass create_graph=True to torch.autograd.grad (as a gradient penalty, a "
            "Hessian-vector product or any second-order gradient needs), and backward() from "
            "what you compute with the gradient then reaches the tensors it came from"
        )
    if cut is not None and cut.kind == "custom backward":
        return (
            f"make {cut.region}.backward() return the gradient for every input of forward "
            "that requires grad (ctx.needs_input_grad[i] says which), one value per input "
            "of forward, in order; None only for inputs that need no gradient"
        )
    if cut is not None and cut.kind == "custom Function":
        return (
            f"pass the tensor to {cut.region}.apply() as an input and return its gradient "
            "from backward(), or compute it outside the Function"
        )
    return (
        "use a differentiable stand-in (a sigmoid of the margin instead of a comparison, "
        "softmax instead of argmax, interpolation between neighbours instead of an index "
        "rounded from a float)"
    )


def _not_yet_text(f: Facts) -> str:
    parts = []
    if f.hooks:
        parts.append(f"; a backward() through this path runs {', '.join(f.hooks)}")
    if f.opaque:
        parts.append(
            f"; if backward() has already run, {' and '.join(f.opaque)} on the path (a custom "
            "autograd Function) may have returned None for it"
        )
    return "".join(parts)


def _non_leaf_fix(f: Facts) -> str:
    read = (
        f"to read its gradient, call {f.tensor}.retain_grad() before backward() (that only "
        f"reads it: {f.tensor} stays a computed tensor, not a parameter to train)"
    )
    train = (
        f"if {f.tensor} is meant to be trained, create it as a leaf in its final form "
        "(with its dtype and device, or do the operation first, then requires_grad_())"
    )
    update = (
        f"update it in place without recording instead, `with torch.no_grad(): {f.tensor} -= "
        f"lr * {f.tensor}.grad`, then {f.tensor}.grad = None (or use an optimizer); "
        f"retain_grad() is not the fix (the graph behind {f.tensor} would grow every step)"
    )
    if f.trace is not None and f.trace.from_grad:
        return (
            f"{f.tensor} was computed from a .grad ({f.tensor} = {f.tensor} - lr * "
            f"{f.tensor}.grad, a parameter updated by hand), which makes it a new, computed "
            f"tensor: {update}"
        )
    if f.update_like:
        by_hand = f"{f.tensor} = {f.tensor} - lr * {f.tensor}.grad"
        return f"if this is a parameter updated by hand ({by_hand}), {update}; otherwise, {read}"
    # a copy of one leaf (.to(), .cuda(), .double(), a view): most likely meant as the leaf
    return f"{train}; {read}" if f.copy_of_leaf else f"{read}; {train}"


def _undecided(f: Facts) -> str:
    if f.compiled:
        return _COMPILED
    if f.trace is None:
        return _OPAQUE if f.opaque else _UNRECORDED
    return _UNSEEN if f.trace.unseen else _UNEXPLAINED


def _where(cut: Cut) -> str:
    return f" (in {cut.where})" if cut.where else ""


def _cut_text(cut: Cut, f: Facts) -> str:
    source = cut.source or "an unnamed result"
    if not f.requires_grad:
        return f"{f.tensor} was made by {cut.op} from {source}{_where(cut)}"
    where = ""
    if cut.source and cut.result and cut.source != cut.result:
        where = f", where {cut.source} became {cut.result}"
    elif cut.source:
        where = f", applied to {cut.source}"
    elif cut.result:
        where = f", which made {cut.result}"
    return f"the path from {f.tensor} to {f.output} is cut at {cut.op}{where}{_where(cut)}"


def _lost_text(f: Facts) -> str:
    if f.trace is None:
        return ""
    parts = [f"a path is cut at {cut.op}{_where(cut)}" for cut in f.trace.lost]
    if f.trace.round_trip:
        parts.append(
            f"its values also left PyTorch and came back as a new tensor ({f.trace.round_trip}), "
            f"which reaches {f.output} with no graph"
        )
    return "; ".join(parts)


_THERE = "use the tensor itself there"
# The fix for a part of the gradient lost at each kind of cut.
_PART_FIXES = {
    "copy": "combine tensors with torch.stack or torch.cat, not torch.tensor",
    "no_grad": "compute that part outside the no-grad region",
    "checkpoint": "pass use_reentrant=False to the checkpoint",
    "autograd.grad": "pass create_graph=True to torch.autograd.grad",
    "integer result": "use a differentiable stand-in for that step",
    "no derivative": "use a differentiable stand-in for that step",
}


def _lost_fix(f: Facts) -> str:
    lost = f.trace.lost if f.trace is not None else []
    fixes = [
        _STATE_DICT_FIX if _in_state_dict(cut) else _PART_FIXES.get(cut.kind, _THERE)
        for cut in lost
    ]
    if f.trace is not None and f.trace.round_trip:
        fixes.append("keep that step in torch operations")
    return "; ".join(dict.fromkeys(fixes)) or "use the tensor itself there"


def _passes_text(f: Facts) -> str:
    passes = f.trace.passes if f.trace is not None else ()
    if any(p.kind == "torch.autograd.grad()" for p in passes):
        return (
            "torch.autograd.grad() returns the gradients instead of filling .grad: use the "
            "values it returns, or call backward() to fill .grad"
        )
    return (
        f"backward(inputs=...) fills .grad only for the tensors listed in inputs, and "
        f"{f.tensor} is not among them: add it to inputs, or leave inputs out"
    )
