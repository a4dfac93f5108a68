"""Unit tests of gradstop.diagnosis: why_no_grad, grad_report and the decision tree."""

import copy
import html
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import gradstop as gp
from gradstop import diagnosis
from gradstop.diagnosis import REACHED, RULES, Reason

X = torch.tensor([1.0, 2.0, 3.0])


def leaf():
    return torch.tensor([0.5, -1.0, 2.0], requires_grad=True)


def bias():
    return torch.tensor(1.0, requires_grad=True)


# One small bug per reason code: each returns (output, tensor, recording or None).


def ok():
    w = leaf()
    loss = (w * X).sum()
    loss.backward()
    return loss, w, None


def not_yet():
    w = leaf()
    optimizer = torch.optim.SGD([w], lr=0.1)
    loss = (w * X).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()  # sets None
    return (w * X).sum(), w, None


def hooked():
    w = leaf()
    with gp.record() as rec:
        h = w * 2
        loss = (h * X).sum()
    h.register_hook(lambda grad: torch.zeros_like(grad))
    loss.backward()
    return loss, w, rec


def non_leaf():
    w = torch.randn(3, requires_grad=True).to(torch.float64)  # looks like a leaf
    return (w * X.double()).sum(), w, None


def not_float():
    index = torch.arange(3)
    return (leaf() * index).sum(), index, None


def no_requires_grad():
    w = torch.ones(3)
    return (w * leaf()).sum(), w, None


def switched_off():
    w = leaf()
    loss = (w * X).sum() + bias()
    w.requires_grad_(False)
    return loss, w, None


def late_requires_grad():
    w, b = torch.ones(3), bias()
    with gp.record() as rec:
        loss = (w * X).sum() + b
    w.requires_grad_()
    return loss, w, rec


def detached():
    w, b = leaf(), bias()
    with gp.record() as rec:
        h = w * 2
        loss = (h.detach() * X).sum() + b
    return loss, w, rec


def data():
    w, b = leaf(), bias()
    with gp.record() as rec:
        h = w * 2
        loss = (h.data * X).sum() + b
    return loss, w, rec


def no_grad():
    w, b = leaf(), bias()
    with gp.record() as rec:
        with torch.no_grad():
            h = w * 2
        loss = (h * X).sum() + b
    return loss, w, rec


def copied():
    w, b = leaf(), bias()
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(t) warns, rightly
        h = torch.tensor(w * 2)
        loss = (h * X).sum() + b
    return loss, w, rec


def not_differentiable():
    threshold, b = torch.tensor(0.0, requires_grad=True), bias()
    with gp.record() as rec:
        kept = (X > threshold).float()
        loss = (kept * X).sum() * b
    return loss, threshold, rec


def left_torch():
    scale, b = torch.tensor(2.0, requires_grad=True), bias()
    with gp.record() as rec:
        loss = (X / scale.item()).sum() * b
    return loss, scale, rec


def unused():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(3, 2))
    with gp.record() as rec:
        loss = model[0](X).sum()
    return loss, model[1].weight, rec


def not_on_path():
    w, b = leaf(), bias()
    with gp.record() as rec:
        auxiliary = (w**2).sum()  # computed, never added  # noqa: F841
        loss = (X * b).sum()
    return loss, w, rec


def undecided():
    w, b = leaf(), bias()
    loss = ((w * 2).detach() * X).sum() + b
    return loss, w, None


CASES = {
    Reason.OK: ok,
    Reason.NOT_YET: not_yet,
    Reason.HOOKED: hooked,
    Reason.NON_LEAF: non_leaf,
    Reason.NOT_FLOAT: not_float,
    Reason.NO_REQUIRES_GRAD: no_requires_grad,
    Reason.SWITCHED_OFF: switched_off,
    Reason.LATE_REQUIRES_GRAD: late_requires_grad,
    Reason.DETACHED: detached,
    Reason.DATA: data,
    Reason.NO_GRAD: no_grad,
    Reason.COPIED: copied,
    Reason.NOT_DIFFERENTIABLE: not_differentiable,
    Reason.LEFT_TORCH: left_torch,
    Reason.UNUSED: unused,
    Reason.NOT_ON_PATH: not_on_path,
    Reason.UNDECIDED: undecided,
}
# A word each sentence must contain: the cause it names.
CAUSE_WORDS = {
    Reason.OK: "holds a gradient (the sum over every backward()",
    Reason.NOT_YET: "zero_grad()",
    Reason.HOOKED: "hook <lambda> on h",
    Reason.NON_LEAF: "grad_fn=ToCopyBackward0",
    Reason.NOT_FLOAT: "torch.int64",
    Reason.NO_REQUIRES_GRAD: "requires_grad=True",
    Reason.SWITCHED_OFF: "requires_grad_(False)",
    Reason.LATE_REQUIRES_GRAD: "before computing loss",
    Reason.DETACHED: "cut at detach(), applied to h,",
    Reason.DATA: "cut at .data",
    Reason.NO_GRAD: "cut at mul(), where w became h, which ran with gradient recording off",
    Reason.COPIED: "cut at torch.tensor()",
    Reason.NOT_DIFFERENTIABLE: "cut at gt()",
    Reason.LEFT_TORCH: "through item()",
    Reason.UNUSED: "no recorded operation used",
    Reason.NOT_ON_PATH: "nothing computed from it reaches loss",
    Reason.UNDECIDED: "recording=rec",
}


def test_every_reason_has_a_case():
    assert set(CASES) == set(Reason) == set(CAUSE_WORDS)


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: r.name)
def test_each_reason_code(reason):
    loss, w, rec = CASES[reason]()  # without a recording, the sentence says "loss", "w"
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is reason, found
    assert CAUSE_WORDS[reason] in found.sentence, found.sentence
    assert found.sentence.count(".") >= 1 and "{" not in found.sentence


def test_the_verdict_agrees_with_backward():
    """Every leaf case: backward() fills .grad exactly when the tool says it reaches."""
    for reason, case in CASES.items():
        output, tensor, rec = case()
        if not tensor.is_leaf:
            continue  # a non-leaf keeps no .grad
        verdict = gp.why_no_grad(output, tensor, recording=rec).reached
        if tensor.grad is None:  # some cases have run backward() already
            output.backward()
        assert (tensor.grad is not None) == verdict, reason


def test_a_fine_gradient_is_ok_and_reached():
    loss, w, _ = ok()
    found = gp.why_no_grad(loss, w)
    assert found.reason is Reason.OK and found.reached
    assert str(found).startswith("OK: backward() from loss reaches w")
    assert max(len(line) for line in str(found).splitlines()) <= 78
    assert found.trail[-1] == "hooks on the path? no"


def test_a_hook_on_an_intermediate_needs_the_recording_and_zeros_are_flagged():
    loss, w, rec = hooked()
    without = gp.why_no_grad(loss, w)
    assert without.reason is Reason.OK and "seen only with recording=rec" in without.sentence
    assert gp.why_no_grad(loss, w, recording=rec).reason is Reason.HOOKED


def test_a_hook_on_the_tensor_itself_is_seen_without_recording():
    w = leaf()
    handle = w.register_hook(lambda grad: grad * 0)
    loss = (w * X).sum()
    loss.backward()
    assert gp.why_no_grad(loss, w).reason is Reason.HOOKED
    handle.remove()
    assert gp.why_no_grad(loss, w).reason is Reason.OK


def test_a_non_leaf_that_retains_its_grad_is_kept():
    w = leaf()
    h = w * 2
    h.retain_grad()
    loss = (h * X).sum()
    assert gp.why_no_grad(loss, h).reason is Reason.NOT_YET
    loss.backward()
    assert gp.why_no_grad(loss, h).reason is Reason.OK


def test_a_leaf_output_reaches_itself_only():
    w, other = leaf(), leaf()
    assert gp.why_no_grad(w, w).reached
    assert gp.why_no_grad(w, other).reason is Reason.UNDECIDED


def test_a_detached_copy_names_what_made_it():
    w = leaf()
    with gp.record() as rec:
        u = w.detach()
        loss = (u * w).sum()
    found = gp.why_no_grad(loss, u, recording=rec)
    assert found.reason is Reason.DETACHED
    assert "u was made by detach() from w" in found.sentence
    assert gp.why_no_grad(loss, u).reason is Reason.NO_REQUIRES_GRAD


def test_a_numpy_round_trip_names_the_detach_and_the_exit():
    w, b = leaf(), bias()
    with gp.record() as rec:
        h = torch.tensor(np.tanh((w * 2).detach().numpy()))
        loss = (h * X).sum() + b
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.LEFT_TORCH
    assert "through detach() then numpy()" in found.sentence


def test_a_new_leaf_made_inside_the_recording_is_a_cut():
    h = leaf()
    with gp.record() as rec:
        p = nn.Parameter(h * 2)  # a new leaf: the gradient stays with p
        loss = (p * X).sum()
    found = gp.why_no_grad(loss, h, recording=rec)
    assert found.reason is Reason.COPIED and "a new leaf" in found.sentence
    model = nn.Linear(3, 1)
    with gp.record() as rec:
        twin = copy.deepcopy(model)  # deepcopy copies a parameter through .data
        loss = twin(X).sum()
    assert gp.why_no_grad(loss, model.weight, recording=rec).reason is Reason.DATA
    loss.backward()
    assert h.grad is None and model.weight.grad is None


def test_inference_mode_is_named():
    w, b = leaf(), bias()
    with gp.record() as rec:
        with torch.inference_mode():
            h = w * 2
        loss = (h.clone() * X).sum() + b
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NO_GRAD and "(inference_mode())" in found.sentence


def test_detach_in_place_on_a_leaf_after_the_forward_is_switched_off():
    w = leaf()
    loss = (w * X).sum() + bias()
    w.detach_()
    assert gp.why_no_grad(loss, w).reason is Reason.SWITCHED_OFF


def test_a_cut_the_recording_missed_is_undecided():
    w, b = leaf(), bias()
    with gp.record() as rec:
        h = w * 2
        with torch._C.DisableTorchFunction():  # hides the next call from the recorder
            h.detach_()
        loss = (h * X).sum() + b
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.UNDECIDED
    assert "something the recording did not see changed" in found.sentence


def test_a_tensor_the_recording_never_saw_is_unused_with_the_proviso():
    w, b = leaf(), bias()
    cut = (w * 2).detach()  # before the recording starts
    with gp.record() as rec:
        loss = (cut * X).sum() + b
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.UNUSED
    assert "if the recording covers the whole forward pass" in found.sentence


# --- bad input -------------------------------------------------------------------


def test_bad_input_is_a_clear_error():
    w = leaf()
    loss = (w * X).sum()
    with pytest.raises(TypeError, match="output must be a torch.Tensor, got float"):
        gp.why_no_grad(1.0, w)
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor, got list"):
        gp.why_no_grad(loss, [1.0])
    with pytest.raises(TypeError, match="recording must be the Recording"):
        gp.why_no_grad(loss, w, recording={})
    with pytest.raises(ValueError, match="output has no autograd graph"):
        gp.why_no_grad(torch.ones(3).sum(), w)
    with gp.record() as rec:
        other = w * 3
    with pytest.raises(ValueError, match="output was not computed inside this recording"):
        gp.why_no_grad(loss, w, recording=rec)
    assert other.requires_grad
    with pytest.raises(ValueError, match="the arguments look swapped"):
        gp.why_no_grad(w, loss)
    assert gp.why_no_grad(loss, w).reached  # the right order works


def test_grad_report_bad_input():
    model = nn.Linear(3, 1)
    loss = model(X).sum()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        gp.grad_report(loss, [model.weight])
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        gp.grad_report(loss, model, optimizer="sgd")
    with pytest.raises(ValueError, match="output has no autograd graph"):
        gp.grad_report(loss.detach(), model)


# --- grad_report -------------------------------------------------------------------


class Tied(nn.Module):
    """An encoder and a decoder that share one weight, and a layer never called."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 2, bias=False)
        self.decoder = nn.Linear(2, 3, bias=False)
        self.tied = nn.Linear(3, 2, bias=False)
        self.tied.weight = self.encoder.weight  # shared
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.decoder(self.encoder(x))


def test_grad_report_lists_a_shared_parameter_under_each_name():
    model = Tied()
    with gp.record() as rec:
        loss = model(X).pow(2).sum()
    report = gp.grad_report(loss, model, recording=rec)
    names = [row.name for row in report.rows]
    assert names == [
        "encoder.weight",
        "decoder.weight",
        "tied.weight",
        "unused.weight",
        "unused.bias",
    ]
    assert report.reached == {"encoder.weight", "decoder.weight", "tied.weight"}
    assert report.reasons["unused.weight"] is Reason.UNUSED
    assert report.reasons["unused.bias"] is Reason.UNUSED


def test_grad_report_without_recording_says_it_cannot_tell():
    model = Tied()
    loss = model(X).pow(2).sum()
    report = gp.grad_report(loss, model)
    assert report.reasons["unused.weight"] is Reason.UNDECIDED
    loss.backward()
    got = {name for name, p in model.named_parameters(remove_duplicate=False) if p.grad is not None}
    assert got == report.reached  # the report agrees with backward()


def test_grad_report_finds_a_frozen_and_a_detached_layer():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 1))
    model[1].requires_grad_(False)
    with gp.record() as rec:
        hidden = model[1](model[0](X)).detach()
        loss = model[2](hidden).sum()
    report = gp.grad_report(loss, model, recording=rec)
    assert report.reached == {"2.weight", "2.bias"}
    assert report.reasons["0.weight"] is Reason.DETACHED
    assert report.reasons["1.weight"] is Reason.NO_REQUIRES_GRAD
    assert "0.weight: NOT reached, DETACHED" in repr(report)
    assert "<th>parameter</th>" in report._repr_html_()


def test_grad_report_flags_a_parameter_replaced_after_the_optimizer_was_built():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.weight = nn.Parameter(torch.zeros(1, 3))
    loss = model(X).sum()
    report = gp.grad_report(loss, model, optimizer=optimizer)
    assert report.not_stepped == {"weight"}
    assert report.reached == {"weight", "bias"}
    assert "in the optimizer" in report._repr_html_()


def test_grad_report_of_a_copied_model_says_unused():
    model = nn.Linear(3, 1)
    twin = copy.deepcopy(model)
    with gp.record() as rec:
        loss = twin(X).sum()
    report = gp.grad_report(loss, model, recording=rec)
    assert set(report.reasons.values()) == {Reason.UNUSED}


# --- the rules and the figure --------------------------------------------------------


def test_rules_are_a_tree_that_reaches_every_reason():
    keys = {q.key for q in RULES}
    assert len(keys) == len(RULES)
    reached, stack, seen = set(), [RULES[0].key], set()
    while stack:
        key = stack.pop()
        assert key not in seen, f"question {key} is reached twice on one path or loops"
        seen.add(key)
        for step in diagnosis.QUESTIONS[key].branches.values():
            if isinstance(step, Reason):
                reached.add(step)
            else:
                assert step in keys
                if step not in seen:
                    stack.append(step)
    assert seen == keys and reached == set(Reason)


def svg_texts(svg: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def test_every_reason_code_appears_in_the_figure():
    tree = gp.decision_tree(caption="How why_no_grad decides.")
    texts = svg_texts(tree.svg)
    assert tree.reasons == {r.name for r in Reason}
    assert [r.name for r in Reason if r.name not in texts] == []
    assert all(r.name in tree.alt for r in Reason)
    assert "How why_no_grad decides." in tree._repr_html_()


def test_the_figure_follows_the_rules_table(monkeypatch):
    extra = diagnosis.Question("extra", "a question added to the table?", lambda f: "yes", {})
    extra.branches["yes"] = Reason.OK
    monkeypatch.setattr(diagnosis, "RULES", (*RULES, extra))
    assert "a question added to the table?" in " ".join(svg_texts(gp.decision_tree().svg))


def test_the_figure_is_byte_stable_and_alt_text_can_be_given():
    assert gp.decision_tree().svg == gp.decision_tree().svg
    assert gp.decision_tree(alt=" a tree ").alt == "a tree"
    with pytest.raises(ValueError, match="alt text is required"):
        gp.decision_tree(alt=" ")


def test_reached_reasons_are_exactly_those_where_gradient_flows():
    assert REACHED == {Reason.OK, Reason.NOT_YET, Reason.HOOKED, Reason.NON_LEAF}


# --- what the recorder notes for the diagnosis ----------------------------------------


def test_the_recording_notes_grad_mode_requires_grad_and_exits():
    w = torch.ones(2)
    with gp.record() as rec:
        before = w * 2
        w.requires_grad_()
        with torch.no_grad():
            quiet = w * 3
        number = (w * 4).sum().item()
    modes = [(c.name, c.grad_enabled) for c in rec.calls]
    assert ("mul", False) in modes and modes.count(("mul", True)) == 2
    assert [c.name for c in rec.exits] == ["item"]
    flags = [rec.states[c.inputs[0]].requires_grad for c in rec.calls if c.name == "mul"]
    assert flags == [False, True, True]
    assert not before.requires_grad and not quiet.requires_grad and number == 8.0


def test_sentences_name_a_parameter_after_the_callers_module():
    encoder = nn.Linear(3, 2)
    loss = encoder(X).sum()
    found = gp.why_no_grad(loss, encoder.weight)
    assert "reaches encoder.weight" in found.sentence
    assert "the graph of loss" in found.sentence


def test_a_parameter_inside_a_sequential_is_named_as_python_reaches_it():
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.ModuleDict({"a-b": nn.Linear(2, 1)}))
    loss = model[2]["a-b"](model[0](X)).sum()
    assert "reaches model[0].weight" in gp.why_no_grad(loss, model[0].weight).sentence
    named = gp.why_no_grad(loss, model[2]["a-b"].bias).sentence
    assert "reaches model[2]['a-b'].bias" in named


def test_switched_off_names_both_places_a_freeze_belongs():
    loss, w, rec = switched_off()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert "after backward()" in found.sentence
    assert "before the forward pass" in found.sentence


def test_a_non_leaf_made_from_a_leaf_in_one_step_points_at_that_leaf():
    w = torch.zeros(2, 3, requires_grad=True).to(torch.float64)
    loss = (w * 2).sum()
    found = gp.why_no_grad(loss, w)
    assert found.reason is Reason.NON_LEAF
    assert "from a torch.float32 leaf of shape (2, 3), whose .grad" in found.sentence
    deeper = w * 2  # made from a non-leaf: nothing to point at
    assert "computed in one operation" not in gp.why_no_grad(deeper.sum(), deeper).sentence


# Cases a fresh reader found (review of issue 15): each once misled the tool.


def test_a_float_operation_without_a_derivative_is_not_called_a_copy():
    w, b = leaf(), bias()
    with gp.record() as rec:
        counts = torch.histc(w * X, bins=4)
        loss = (counts.sum() * b).sum()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_DIFFERENTIABLE
    assert "cut at histc()" in found.sentence and "no derivative" in found.sentence
    assert "copies" not in found.sentence


def test_detach_by_any_name_is_detached_and_an_in_place_one_is_worded_plainly():
    w, b = leaf(), bias()
    with gp.record() as rec:
        u = torch.ops.aten.detach.default(w * X)
        loss = (u.sum() * b).sum()
    assert gp.why_no_grad(loss, w, recording=rec).reason is Reason.DETACHED
    with gp.record() as rec:
        h = w * X
        h.detach_()
        loss = (h.sum() * b).sum()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.DETACHED and "h became h" not in found.sentence


def test_a_module_backward_hook_is_seen_without_a_recording():
    layer, head = nn.Linear(3, 3), nn.Linear(3, 1)
    head.register_full_backward_pre_hook(lambda module, out: (torch.zeros_like(out[0]),))
    loss = head(layer(X)).sum()
    loss.backward()
    assert torch.count_nonzero(layer.weight.grad) == 0
    found = gp.why_no_grad(loss, layer.weight)
    assert found.reason is Reason.HOOKED and "module's backward hook" in found.sentence
    plain = nn.Linear(3, 1)
    loss = plain(layer(X)).sum()
    assert "module's backward hook" not in gp.why_no_grad(loss, layer.weight).sentence


def test_a_custom_function_makes_an_unreached_tensor_undecided_not_unreached():
    layer, inputs = nn.Linear(3, 1), torch.randn(2, 3, requires_grad=True)
    loss = torch.utils.checkpoint.checkpoint(layer, inputs, use_reentrant=True).sum()
    found = gp.why_no_grad(loss, layer.weight)
    assert found.reason is Reason.UNDECIDED and "CheckpointFunctionBackward" in found.sentence
    assert "does not reach" not in found.sentence
    loss.backward()
    assert layer.weight.grad is not None  # it did reach it: "does not reach" would be false


def test_a_custom_function_returning_none_is_named_when_grad_stays_none():
    class Dropped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return None

    w = leaf()
    loss = Dropped.apply(w).sum()
    loss.backward()
    found = gp.why_no_grad(loss, w)
    assert w.grad is None and found.reason is Reason.NOT_YET
    assert "DroppedBackward" in found.sentence and "returned None" in found.sentence


def test_a_value_that_left_through_item_names_both_readings():
    w, b = leaf(), bias()
    logged = {}
    with gp.record() as rec:
        term = (w * X).sum()
        logged["term"] = term.item()  # logged, never added
        loss = (X * b).sum()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.LEFT_TORCH
    assert "only logged" in found.sentence and "add it to loss" in found.sentence


def test_all_zero_gradients_name_a_flat_step_as_well_as_hooks():
    d = torch.tensor(0.5, requires_grad=True)
    loss = (X - d).round().sum()
    loss.backward()
    assert d.grad.item() == 0.0
    found = gp.why_no_grad(loss, d)
    assert found.reason is Reason.OK and "round()" in found.sentence


def test_a_non_leaf_copy_of_a_leaf_offers_the_leaf_fix_first():
    moved = torch.zeros(3, requires_grad=True).to(torch.float64)
    first = gp.why_no_grad((moved * 2).sum(), moved).sentence.split(": ", 1)[1]
    assert first.startswith("if moved is meant to be trained")
    w = leaf()
    h = w * X  # a computed value: reading its gradient is the likelier wish
    second = gp.why_no_grad(h.sum(), h).sentence.split(": ", 1)[1]
    assert second.startswith("to read its gradient, call h.retain_grad()")
