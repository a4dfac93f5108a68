"""Unit tests of gradstop.diagnosis: why_no_grad, grad_report and the decision tree."""

import contextlib
import copy
import html
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_ as clip_norm

import gradstop as gp
from gradstop import diagnosis
from gradstop.diagnosis import REACHED, RULES, Reason
from gradstop.diagnosis.picture import PART_HEIGHT, split_points

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


def partial():
    w = leaf()
    with gp.record() as rec:
        h = w * X
        loss = (h * h.detach()).sum()  # one path kept, one cut
    return loss, w, rec


def not_accumulated():
    w = leaf()
    with gp.record() as rec:
        loss = (w * X).sum()
        torch.autograd.grad(loss, w, retain_graph=True)  # returns it, fills no .grad
    return loss, w, rec


def unregistered():
    return ok()  # the tensor is then asked about as a loose tensor of a model


def checkpointed():
    block, head = nn.Linear(3, 3), nn.Linear(3, 1)
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True"
        out = torch.utils.checkpoint.checkpoint(block, X, use_reentrant=True)
        loss = head(out).sum()
    return loss, block.weight, rec


def recomputed():
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    loss = layer(X).sum()
    return loss, layer.weight, None  # a fresh tensor: not the one loss used


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
    Reason.PARTIAL: partial,
    Reason.NOT_ACCUMULATED: not_accumulated,
    Reason.UNREGISTERED: unregistered,
    Reason.CHECKPOINTED: checkpointed,
    Reason.RECOMPUTED: recomputed,
}
# A word each sentence must contain: the cause it names.
CAUSE_WORDS = {
    Reason.OK: "holds a gradient (the sum over every backward()",
    Reason.PARTIAL: "a path is cut at detach()",
    Reason.NOT_ACCUMULATED: "torch.autograd.grad() returns the gradients",
    Reason.UNREGISTERED: "not a registered parameter",
    Reason.CHECKPOINTED: "use_reentrant=False",
    Reason.RECOMPUTED: "each time it is read (a parametrization",
    Reason.NOT_YET: "zero_grad()",
    Reason.HOOKED: "hook <lambda> on h",
    Reason.NON_LEAF: "grad_fn=ToCopyBackward0",
    Reason.NOT_FLOAT: "torch.int64",
    Reason.NO_REQUIRES_GRAD: "requires_grad=True",
    Reason.SWITCHED_OFF: "requires_grad_(False)",
    Reason.LATE_REQUIRES_GRAD: "before computing loss",
    Reason.DETACHED: "cut at detach(), applied to h (in `h.detach()`, line",
    Reason.DATA: "cut at .data",
    Reason.NO_GRAD: "cut at mul(), where w became h (in `w * 2`, line",
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
    if reason is Reason.UNREGISTERED:  # only grad_report asks whether it is registered
        found = diagnosis.diagnose(loss, w, rec, ("w", "loss"), registered=False)
    else:
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
    assert found.trail[-1] == "hooks on the path that change it? no"


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


@torch.no_grad()
def _embedded(w):
    return w * 2


@torch.enable_grad()
def _recorded(w):
    return w * 2


def test_a_no_grad_decorator_is_named_by_its_function():
    w = leaf()
    with gp.record() as rec:
        loss = (_embedded(w) * X).sum() + w.sum()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert "inside _embedded(), which is decorated with @torch.no_grad()" in found.sentence
    with gp.record() as rec, torch.no_grad():
        loss = (_recorded(w) * X).sum()  # enable_grad() is not the cut: no name
    found = gp.why_no_grad(loss, w, recording=rec)
    assert "decorated with" not in found.sentence.split("(a function")[0]


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
    """Every piece of text in the SVG: whole <text> elements and each <tspan> in them."""
    pieces = re.findall(r"<(?:text|tspan)[^>]*>([^<]*)</(?:text|tspan)>", svg)
    return [html.unescape(t).strip() for t in pieces if t.strip()]


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
    first = diagnosis.Question(
        RULES[0].key, RULES[0].text, RULES[0].answer, {**RULES[0].branches, "no": "extra"}
    )
    monkeypatch.setattr(diagnosis.rules, "RULES", (first, *RULES[1:], extra))
    texts = " ".join(svg_texts(gp.decision_tree().svg))
    assert "a question added to the table?" in texts


def test_the_figure_is_byte_stable_and_alt_text_can_be_given():
    assert gp.decision_tree().svg == gp.decision_tree().svg
    assert gp.decision_tree(alt=" a tree ").alt == "a tree"
    with pytest.raises(ValueError, match="alt text is required"):
        gp.decision_tree(alt=" ")


def test_a_tall_tree_is_shown_in_parts_no_taller_than_a_screen():
    tree = gp.decision_tree(caption="How why_no_grad decides.")
    heights = [int(re.search(r'height="(\d+)"', svg).group(1)) for svg, _ in tree.parts]
    widths = {re.search(r'width="(\d+)"', svg).group(1) for svg, _ in tree.parts}
    whole = int(re.search(r'height="(\d+)"', tree.svg).group(1))
    assert whole > PART_HEIGHT and len(tree.parts) >= 2 and max(heights) <= PART_HEIGHT
    assert len(widths) == 1  # one width: the parts are shown at one scale
    # every box of the whole tree is in exactly one part, in order
    boxes = [t for svg, _ in tree.parts for t in svg_texts(svg)]
    assert boxes == svg_texts(tree.svg)
    shown = tree._repr_html_()
    assert shown.count("<img ") == len(tree.parts) and "How why_no_grad decides." in shown
    assert all(alt for _, alt in tree.parts) and tree.parts[0][1] == tree.alt


def test_split_points_share_rows_evenly_and_reject_empty_parts():
    assert split_points(62, 42) == [0, 31, 62]
    assert split_points(10, 42) == [0, 10]
    assert split_points(85, 42) == [0, 28, 57, 85]
    with pytest.raises(ValueError, match="at least one row"):
        split_points(10, 0)


def test_reached_reasons_are_exactly_those_where_gradient_flows():
    assert REACHED == {
        Reason.OK,
        Reason.NOT_YET,
        Reason.HOOKED,
        Reason.NON_LEAF,
        Reason.PARTIAL,
        Reason.NOT_ACCUMULATED,
        Reason.UNREGISTERED,
    }


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


def test_a_custom_function_returning_none_is_named_as_the_cut_once_backward_is_recorded():
    class Dropped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, scale):
            return t * scale

        @staticmethod
        def backward(ctx, grad):
            return None, grad  # forgets the gradient of t

    w, scale = leaf(), bias()
    with gp.record() as rec:
        loss = Dropped.apply(w, scale).sum()
        loss.backward()
    assert w.grad is None and scale.grad is not None  # what PyTorch does
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_DIFFERENTIABLE and not found.reached, found
    assert "cut at Dropped.backward() (node DroppedBackward)" in found.sentence, found
    assert "make Dropped.backward() return the gradient" in found.sentence
    assert gp.why_no_grad(loss, scale, recording=rec).reason is Reason.OK
    fresh = leaf()
    with gp.record() as rec:  # recorded, but before any backward(): not yet
        loss = Dropped.apply(fresh, scale).sum()
    assert gp.why_no_grad(loss, fresh, recording=rec).reason is Reason.NOT_YET


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


# --- The cases forums ask about (issue 26): each verdict checked against what PyTorch does.


def fit(u, b):
    return (u.sum() + b - 1).pow(2).sum()


@pytest.mark.parametrize(
    "make, reason, words",
    [
        ("torch.tensor(losses)", Reason.COPIED, "torch.stack"),
        ("torch.stack(losses).argmax().float()", Reason.NOT_DIFFERENTIABLE, "argmax()"),
    ],
)
def test_a_loss_with_no_graph_is_diagnosed_from_the_recording(make, reason, words):
    w = leaf()
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(list of tensors) warns once
        losses = [(w * xi - 1).pow(2).sum() for xi in X]
        loss = eval(make, {"torch": torch, "losses": losses})
    assert loss.grad_fn is None and not loss.requires_grad
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        loss.backward()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is reason and words in found.sentence
    assert "raises 'element 0 of tensors does not require grad" in found.sentence
    with pytest.raises(ValueError, match="pass recording=rec"):
        gp.why_no_grad(loss, w)  # without the recording there is nothing to read


def test_a_loss_computed_under_no_grad_or_a_reentrant_checkpoint_is_read_too():
    model = nn.Linear(3, 1)
    with gp.record() as rec:
        with torch.no_grad():
            loss = model(X).pow(2).sum()
    assert gp.why_no_grad(loss, model.weight, recording=rec).reason is Reason.NO_GRAD
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = torch.utils.checkpoint.checkpoint(model, X, use_reentrant=True).sum()
    assert loss.grad_fn is None
    found = gp.why_no_grad(loss, model.weight, recording=rec)
    assert found.reason is Reason.CHECKPOINTED and "use_reentrant=False" in found.sentence


def full_gradient(make_loss, w):
    """w's gradient with every path kept (the reference a partial cut falls short of)."""
    (grad,) = torch.autograd.grad(make_loss(w, keep=True), w)
    return grad


def test_a_partial_cut_is_named_although_grad_is_filled():
    def loss_of(w, keep=False):
        h = w * X
        back = h.tanh() if keep else torch.tensor(np.tanh(h.detach().numpy()))
        return (h * 2 + back).sum()

    w = leaf()
    with gp.record() as rec:
        loss = loss_of(w)
    loss.backward()
    assert w.grad is not None and not torch.allclose(w.grad, full_gradient(loss_of, w))
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.PARTIAL and found.reached
    assert "left PyTorch and came back" in found.sentence and "numpy()" in found.sentence
    assert found.uses == ("mul(): reaches loss",)
    assert gp.why_no_grad(loss, w).reason is Reason.OK  # the graph alone cannot see it


def test_a_detach_beside_a_kept_path_is_partial_and_names_the_line():
    w = leaf()
    with gp.record() as rec:
        h = w * X
        loss = (h * h.detach()).sum()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.PARTIAL
    assert "cut at detach() (in `h.detach()`, line" in found.sentence
    assert "If that cut is meant (a stop-gradient, a target), this is right" in found.sentence


def hooked_pair(kind):
    """Two layers; on the second, a hook that returns zeros (a full hook or a pre-hook)."""
    first, second = nn.Linear(3, 3), nn.Linear(3, 1)
    if kind == "full":
        second.register_full_backward_hook(lambda m, gin, gout: (torch.zeros_like(gin[0]),))
    else:
        second.register_full_backward_pre_hook(lambda m, gout: (torch.zeros_like(gout[0]),))
    return first, second


def plain_grads(first, second):
    twin_first, twin_second = copy.deepcopy(first), copy.deepcopy(second)
    twin_first._backward_hooks.clear()
    twin_second._backward_hooks.clear()
    twin_second._backward_pre_hooks.clear()
    twin_second(twin_first(X)).sum().backward()
    return twin_first.weight.grad, twin_second.weight.grad


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "graph only"])
def test_a_full_backward_hook_cannot_change_its_own_modules_parameters(recorded):
    first, second = hooked_pair("full")
    plain_first, plain_second = plain_grads(first, second)
    with gp.record() as rec:
        loss = second(first(X)).sum()
    loss.backward()
    torch.testing.assert_close(second.weight.grad, plain_second)  # the hook did not touch it
    assert torch.count_nonzero(first.weight.grad) == 0 != torch.count_nonzero(plain_first)
    rec = rec if recorded else None
    own = gp.why_no_grad(loss, second.weight, recording=rec)
    assert own.reason is Reason.OK and "full backward hook" in own.sentence
    assert "cannot change this gradient" in own.sentence
    assert gp.why_no_grad(loss, first.weight, recording=rec).reason is Reason.HOOKED


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "graph only"])
def test_a_backward_pre_hook_changes_its_own_modules_parameters(recorded):
    first, second = hooked_pair("pre")
    with gp.record() as rec:
        loss = second(first(X)).sum()
    loss.backward()
    assert torch.count_nonzero(second.weight.grad) == 0
    found = gp.why_no_grad(loss, second.weight, recording=rec if recorded else None)
    assert (
        found.reason is Reason.HOOKED and "backward pre-hook <lambda> on second" in found.sentence
    )


def test_a_module_whose_input_needs_no_grad_explains_grad_input_none():
    layer, seen = nn.Linear(3, 2), []
    layer.register_full_backward_hook(lambda m, gin, gout: seen.append(gin))
    with gp.record() as rec, pytest.warns(UserWarning, match="Full backward hook is firing"):
        loss = layer(X).sum()
        loss.backward()
    assert seen == [(None,)]
    found = gp.why_no_grad(loss, layer.weight, recording=rec)
    assert found.reason is Reason.OK and "grad_input == (None,)" in found.sentence


def test_a_hook_registered_before_an_in_place_op_is_seen():
    x = torch.ones(3, requires_grad=True)
    with gp.record() as rec:
        y = x * 2
        handle = y.register_hook(lambda grad: grad * 10)
        y.mul_(3)
        loss = y.sum()
    loss.backward()
    assert x.grad.tolist() == [60.0, 60.0, 60.0]  # 2 * 3 * 10: the hook did run
    found = gp.why_no_grad(loss, x, recording=rec)
    assert found.reason is Reason.HOOKED and "registered before mul_()" in found.sentence
    handle.remove()
    assert gp.why_no_grad(loss, x, recording=rec).reason is Reason.OK


@pytest.mark.parametrize(
    "make",
    [
        "torch.tensor(losses)",
        "torch.as_tensor(losses)",
        "torch.Tensor(losses)",
        "torch.FloatTensor(losses)",
        "losses[0].new_tensor(losses)",
    ],
)
def test_every_copy_constructor_is_a_copy_fixed_by_stack(make, tmp_path):
    # The legacy constructors are seen only through the line that ran them, so the
    # case runs from a file of its own (as a reader's script or notebook cell would).
    script = tmp_path / "bug.py"
    script.write_text(
        "import warnings\nimport torch\nimport gradstop as gp\n"
        "w, b = torch.ones(3, requires_grad=True), torch.ones(1, requires_grad=True)\n"
        "with gp.record() as rec, warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    losses = [(w * k).sum() for k in range(3)]\n"
        f"    total = {make}.sum() * b\n"
        "found = gp.why_no_grad(total, w, recording=rec)\n"
    )
    space: dict = {}
    exec(compile(script.read_text(), str(script), "exec"), space)
    found = space["found"]
    assert found.reason is Reason.COPIED, found
    assert "torch.stack" in found.sentence and "line 8" in found.sentence
    w = leaf()
    torch.stack([(w * k).sum() for k in range(3)]).sum().backward()
    assert w.grad is not None  # the fix keeps the graph


def test_a_parametrized_weight_is_recomputed_on_every_read():
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    loss = layer(X).sum()
    loss.backward()
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        assert layer.weight.grad is None
    assert layer.weight is not layer.weight  # a fresh tensor on every read
    found = gp.why_no_grad(loss, layer.weight)
    assert found.reason is Reason.RECOMPUTED and found.sentence.startswith("layer.weight is")
    originals = layer.parametrizations.weight
    assert originals.original0.grad is not None and originals.original1.grad is not None
    assert "layer.parametrizations.weight.original1" in found.sentence
    report = gp.grad_report(loss, layer)
    assert report.reasons["parametrizations.weight.original0"] is Reason.OK


def test_autograd_grad_and_backward_inputs_fill_no_grad_for_the_others():
    w = leaf()
    with gp.record() as rec:
        loss = (w * X).sum()
        (grad,) = torch.autograd.grad(loss, w)
    assert w.grad is None and grad is not None
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_ACCUMULATED and "use the values it returns" in found.sentence
    w, x = leaf(), leaf()
    with gp.record() as rec:
        loss = (w * x).sum()
        loss.backward(inputs=[x])
    assert w.grad is None and x.grad is not None
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_ACCUMULATED and "not among them" in found.sentence
    assert gp.why_no_grad(loss, x, recording=rec).reason is Reason.OK


def test_checkpointing_in_both_flavours():
    block, head = nn.Linear(3, 3), nn.Linear(3, 1)
    inputs = torch.randn(2, 3, requires_grad=True)
    for reentrant in (False, True):
        block.zero_grad()
        with gp.record() as rec:
            out = torch.utils.checkpoint.checkpoint(block, inputs, use_reentrant=reentrant)
            loss = head(out).sum()
        assert gp.why_no_grad(loss, block.weight, recording=rec).reason is Reason.NOT_YET
        without = gp.why_no_grad(loss, block.weight).reason
        assert without is (Reason.UNDECIDED if reentrant else Reason.NOT_YET)
        loss.backward()
        assert block.weight.grad is not None
        assert gp.why_no_grad(loss, block.weight, recording=rec).reason is Reason.OK


def test_checkpoint_without_an_input_that_requires_grad_is_fixed_by_use_reentrant_false():
    loss, weight, rec = checkpointed()
    loss.backward()
    assert weight.grad is None
    block, head = nn.Linear(3, 3), nn.Linear(3, 1)
    head(torch.utils.checkpoint.checkpoint(block, X, use_reentrant=False)).sum().backward()
    assert block.weight.grad is not None  # the fix the sentence gives


def test_a_manual_update_is_a_non_leaf_whose_fix_is_in_place_under_no_grad():
    w = leaf()
    with gp.record() as rec:
        loss = fit(w * X, 0.0)
        loss.backward()
        w = w - 0.1 * w.grad  # a new, computed tensor
        loss = fit(w * X, 0.0)
    for recording in (rec, None):
        found = gp.why_no_grad(loss, w, recording=recording)
        assert found.reason is Reason.NON_LEAF
        fix = found.sentence.split(": ", 1)[1]
        assert fix.index("torch.no_grad()") < fix.find("retain_grad() is not the fix")
    assert "w was computed from a .grad" in gp.why_no_grad(loss, w, recording=rec).sentence
    w = leaf()  # the fix: w stays the same leaf, and its gradient comes every step
    for _ in range(3):
        fit(w * X, 0.0).backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
        w.grad = None
    assert w.is_leaf and w.grad_fn is None


def test_grad_report_finds_tensors_the_model_holds_without_registering_them():
    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(3, 3) for _ in range(2)]  # not nn.ModuleList
            self.gain = torch.ones(1, requires_grad=True)  # not nn.Parameter
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x).relu()
            return self.head(x) * self.gain

    model = Loose()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(X).sum()
    report = gp.grad_report(loss, model, optimizer=optimizer)
    loose = {"blocks[0].weight", "blocks[0].bias", "blocks[1].weight", "blocks[1].bias", "gain"}
    assert report.unregistered == loose
    assert {report.reasons[n] for n in loose} == {Reason.UNREGISTERED}
    assert {n for n, _ in model.named_parameters()} == {"head.weight", "head.bias"}
    assert "nn.ModuleList" in repr(report) and "(as for blocks[0].weight)" in repr(report)
    held = torch.optim.SGD([*model.parameters(), model.gain], lr=0.1)  # held: not flagged
    assert gp.grad_report(loss, model, optimizer=held).reasons["gain"] is Reason.NOT_YET


def test_a_custom_function_is_named_and_only_its_inputs_get_gradient():
    class Rounded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            result = t.round()
            ctx.mark_non_differentiable(result)
            return result

        @staticmethod
        def backward(ctx, grad):
            return None

    w, b = leaf(), bias()
    with gp.record() as rec:
        loss = fit(Rounded.apply(w * X), b)
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_DIFFERENTIABLE and "forward of Rounded" in found.sentence
    scale = torch.tensor(2.0, requires_grad=True)

    class Scaled(torch.autograd.Function):  # uses scale, not given as an input
        @staticmethod
        def forward(ctx, t):
            return t * scale

        @staticmethod
        def backward(ctx, grad):
            return grad * 2.0

    with gp.record() as rec:
        loss = fit(Scaled.apply(w * X), b)
    loss.backward()
    assert scale.grad is None and w.grad is not None
    found = gp.why_no_grad(loss, scale, recording=rec)
    assert found.reason is Reason.NOT_DIFFERENTIABLE and "Scaled.apply()" in found.sentence
    assert gp.why_no_grad(loss, w, recording=rec).reason is Reason.OK  # no false PARTIAL


def test_a_module_called_through_forward_skips_its_hooks_and_the_report_says_so():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    calls = []
    model[1].register_full_backward_hook(lambda m, gin, gout: calls.append(m))
    with gp.record() as rec:
        loss = model[1].forward(model[0](X)).sum()  # .forward(): no hooks
    loss.backward()
    assert calls == []
    report = gp.grad_report(loss, model, recording=rec)
    assert any("1 has backward hooks" in note and ".forward()" in note for note in report.notes)


# --- torch.compile: read correctly, or said clearly that it cannot be


class CutInside(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 1)

    def forward(self, x):
        return self.b(self.a(x).detach())


@pytest.fixture(scope="module")
def compiled():
    model = CutInside()
    return model, torch.compile(model, backend="aot_eager")


def test_a_compiled_model_without_a_recording_is_undecided_not_guessed(compiled):
    model, fast = compiled
    model.zero_grad()
    loss = fast(X).sum()
    assert "CompiledFunctionBackward" in gp.grad_fn_names(loss)
    loss.backward()
    assert model.a.weight.grad is None and model.b.weight.grad is not None
    cut = gp.why_no_grad(loss, model.a.weight)
    assert cut.reason is Reason.UNDECIDED and "torch.compile'd code" in cut.sentence
    assert "model._orig_mod" in cut.sentence
    kept = gp.why_no_grad(loss, model.b.weight)
    assert kept.reason is Reason.OK and "torch.compile'd code" in kept.sentence


def test_a_compiled_model_inside_a_recording_runs_eagerly_and_is_read(compiled):
    model, fast = compiled
    model.zero_grad()
    with gp.record() as rec:
        loss = fast(X).sum()
    assert "CompiledFunctionBackward" not in gp.grad_fn_names(loss)
    found = gp.why_no_grad(loss, model.a.weight, recording=rec)
    assert found.reason is Reason.DETACHED and "self.a(x).detach()" in found.sentence
    loss.backward()
    assert gp.why_no_grad(loss, model.b.weight, recording=rec).reason is Reason.OK
    assert model.a.weight.grad is None


# --- diagnose_step: around a reader's own training step

INPUTS, TARGETS = torch.randn(8, 3), torch.randn(8, 1)


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def test_diagnose_step_on_a_fine_step_lists_every_parameter_as_fine(capsys):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer) as step:
        optimizer.zero_grad()
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.step()
    printed = capsys.readouterr().out
    assert printed.startswith("diagnose_step: backward() from loss; optimizer.step() ran 1 time.")
    assert "Fine (the gradient arrived, and optimizer.step() changed it): 0.weight" in printed
    assert step.problems == {} and set(step.reasons.values()) == {Reason.OK}
    assert max(len(line) for line in printed.splitlines()) <= 80


def test_diagnose_step_reports_a_loss_with_no_graph_and_lets_the_error_through(capsys):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="element 0 of tensors"):
        with gp.diagnose_step(model, optimizer) as step:
            losses = [(model(x) - y).pow(2).sum() for x, y in zip(INPUTS, TARGETS, strict=True)]
            loss = torch.tensor(losses).mean()
            loss.backward()
    printed = capsys.readouterr().out
    assert "The block raised RuntimeError: element 0 of tensors" in printed
    assert set(step.reasons.values()) == {Reason.COPIED}
    assert "torch.stack" in printed and "`torch.tensor(losses)`" in printed


def test_diagnose_step_sees_zero_grad_between_backward_and_step():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.zero_grad()  # wipes the gradients the step needs
        optimizer.step()
    assert {r.changed for r in step.rows} == {False}
    assert all("never between them" in text for text in step.problems.values())


def test_diagnose_step_sees_the_step_come_before_the_backward():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        optimizer.step()  # before the gradient exists
        loss.backward()
    assert {r.changed for r in step.rows} == {False}
    assert {r.verdict for r in step.rows} == {"optimizer.step() ran before backward()"}
    assert all("call loss.backward() first" in text for text in step.problems.values())
    assert not any("never between them" in text for text in step.problems.values())


def test_diagnose_step_sees_zero_grad_undo_gradient_accumulation():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        for inputs, targets in zip(INPUTS.chunk(4), TARGETS.chunk(4), strict=True):
            optimizer.zero_grad()  # every micro-batch: only the last one's gradient is left
            ((model(inputs) - targets).pow(2).mean() / 4).backward()
        optimizer.step()
    assert any(
        "zero_grad() ran between backward passes" in n and "(3 times)" in n for n in step.notes
    )
    with gp.diagnose_step(model, optimizer, show=False) as step:  # accumulated right
        optimizer.zero_grad()
        for inputs, targets in zip(INPUTS.chunk(4), TARGETS.chunk(4), strict=True):
            ((model(inputs) - targets).pow(2).mean() / 4).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not any("zero_grad()" in n for n in step.notes)
    assert type(optimizer).zero_grad is torch.optim.SGD.zero_grad  # the watch is gone
    assert "zero_grad" not in vars(optimizer) and "zero_grad" not in vars(model)


def test_a_zero_grad_that_clears_nothing_is_not_undone_accumulation():
    # A GAN's generator step: the discriminator's backward ran first, through
    # fake.detach(), so the generator's zero_grad() finds no gradient to throw away.
    generator, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(critic.parameters(), lr=0.1)
    with gp.diagnose_step(generator, opt_g, show=False) as step:
        fake = generator(INPUTS[:, :2])
        opt_d.zero_grad()
        critic(fake.detach()).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        (-critic(fake).mean()).backward()
        opt_g.step()
    assert not any("zero_grad()" in n for n in step.notes), step.notes


def test_diagnose_step_sees_a_hand_written_step_that_changes_no_parameter():
    model = small_model()
    with gp.diagnose_step(model, show=False) as step:
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        for p in model.parameters():
            p = p - 0.1 * p.grad  # rebinds the loop variable only
    assert any("changed no parameter" in n and "p -= lr * p.grad" in n for n in step.notes)
    with gp.diagnose_step(model, show=False) as step:
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    assert not any("changed no parameter" in n for n in step.notes)


def test_diagnose_step_says_eval_freezes_nothing():
    model = small_model().eval()  # meant to freeze it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        optimizer.step()
    assert all(r.changed for r in step.rows)  # what PyTorch does: eval() froze nothing
    (note,) = [n for n in step.notes if "eval mode" in n]
    assert "freezes nothing" in note and "requires_grad_(False)" in note
    assert not any("frozen" in r.verdict for r in step.rows)
    model.train()
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        optimizer.step()
    assert not any("eval mode" in n for n in step.notes)


def test_diagnose_step_sees_momentum_move_a_parameter_whose_gradient_a_hook_zeroed():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    model.weight.register_hook(torch.zeros_like)  # meant to freeze it
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        optimizer.step()
    weight = next(r for r in step.rows if r.name == "weight")
    assert weight.grad_at_step == "zeros" and weight.changed  # weight decay moved it
    assert "momentum or weight decay" in weight.problem
    assert step.reasons["weight"] is Reason.HOOKED


def test_diagnose_step_names_parameters_the_optimizer_does_not_hold():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.weight = nn.Parameter(torch.zeros(1, 3))  # replaced after the optimizer
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        optimizer.step()
    assert "the optimizer holds another tensor" in step.problems["weight"]
    assert "the optimizer's parameter 0 (not the model's)" in step.problems


def test_diagnose_step_flags_a_manual_update_on_the_step_that_makes_it():
    w = leaf()
    with gp.diagnose_step(tensors={"w": w}, show=False) as step:
        loss = fit(w * X, 0.0)
        loss.backward()
        w = w - 0.1 * w.grad
    assert step.reasons == {"w": Reason.OK}
    assert any("w now holds a new tensor computed from w.grad" in n for n in step.notes)
    assert "optimizer.step()" not in str(step).splitlines()[0]


def test_diagnose_step_with_tensors_of_a_plain_list(capsys):
    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(3, 3)]
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(self.blocks[0](x))

    model = Loose()
    optimizer = torch.optim.Adam(model.parameters())
    with gp.diagnose_step(model, optimizer) as step:
        optimizer.zero_grad()
        model(INPUTS).pow(2).mean().backward()
        optimizer.step()
    assert step.reasons["blocks[0].weight"] is Reason.UNREGISTERED
    assert "blocks[0].weight, blocks[0].bias: reached; not a registered" in capsys.readouterr().out


def test_diagnose_step_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        with gp.diagnose_step([1]):
            pass
    with pytest.raises(TypeError, match="tensors must be a dict"):
        with gp.diagnose_step(tensors=[leaf()]):
            pass
    with pytest.raises(ValueError, match="give the model, the optimizer or tensors"):
        with gp.diagnose_step():
            pass


def test_diagnose_step_without_backward_says_where_to_put_it():
    model = small_model()
    with gp.diagnose_step(model, show=False) as step:
        model(INPUTS).sum()
    assert step.losses == () and "Put loss.backward() inside the block" in str(step)


def test_diagnose_step_explains_an_in_place_error_and_names_the_change(capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with gp.diagnose_step(model, optimizer):
            loss = model(INPUTS).pow(2).mean()
            loss.backward(retain_graph=True)  # "silences" the second-backward error...
            optimizer.step()  # ...but the step changes what the graph saved
            loss.backward()
    printed = " ".join(capsys.readouterr().out.split())
    assert "What it means: a tensor saved for the gradient was changed in place" in printed, printed
    assert (
        "Here: linear() saved 2.weight (a view of it, shape [4, 1]); "
        "then add_() (in `optimizer.step()`" in printed
    )


@pytest.mark.parametrize(
    "error, words",
    [
        ("Trying to backward through the graph a second time (or ...)", "h = h.detach()"),
        ("grad can be implicitly created only for scalar outputs", "loss.mean()"),
        ("unsupported operand type(s) for *: 'float' and 'NoneType'", "a .grad was None"),
        ("a leaf Variable that requires grad is being used in an in-place operation.", "no_grad"),
        ("optimizer got an empty parameter list", "params = list(...)"),
        (
            "Function FusedBackward returned an invalid gradient at index 1 - got [16, 32] "
            "but expected shape compatible with [32, 16]",
            "grad_out.t() @ x",
        ),
        ("something else entirely", ""),
    ],
)
def test_the_errors_readers_meet_are_explained(error, words):
    from gradstop.diagnosis.errors import explain

    text = explain(error, gp.forward.Recording(), {})
    assert (words in text) if words else text == ""


class _Queue(nn.Module):
    """MoCo's pattern: a buffer of keys, read by a product, then overwritten in place."""

    def __init__(self, clone):
        super().__init__()
        self.encoder = nn.Linear(3, 4)
        self.target = nn.Linear(5, 4).requires_grad_(False)  # the shape of queue.t()
        self.register_buffer("queue", torch.ones(5, 4) / 2)
        self.clone = clone

    def forward(self, x):
        with torch.no_grad():
            self.target.weight.mul_(0.9)  # a write, of a tensor no graph saved
        q = self.encoder(x)
        logits = q @ (self.queue.clone() if self.clone else self.queue).t()
        self.queue[:2] = q.detach()[:2]
        return logits


def test_an_in_place_error_names_the_tensor_saved_then_written_not_one_of_its_shape():
    model = _Queue(clone=False)
    optimizer = torch.optim.SGD(model.encoder.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with gp.diagnose_step(model, optimizer, show=False) as step:
            model(INPUTS).sum().backward()
    here = " ".join(step.explained.split("Here: ")[1].split())
    assert here.startswith(
        "matmul() saved queue (a view of it, shape [4, 5]); then an indexed assignment"
    )
    assert here.endswith(
        "give matmul() a copy (queue.clone()), or make the change after backward()"
    )
    model = _Queue(clone=True)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        model(INPUTS).sum().backward()
    assert step.error == ""


def test_an_in_place_error_the_recording_cannot_place_points_to_anomaly_mode():
    from gradstop.diagnosis.errors import explain

    error = (
        "one of the variables needed for gradient computation has been modified by an "
        "inplace operation: [torch.FloatTensor [3]] is at version 1; expected version 0"
    )
    assert "set_detect_anomaly(True)" in explain(error, gp.forward.Recording(), {})


def _rnn_steps(carry, steps=2):
    """Steps of an RNN whose state is carried from one step to the next by ``carry``;
    the report of the step that raised (or of the last step)."""
    torch.manual_seed(0)
    rnn, head = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 1)
    model = nn.ModuleDict({"rnn": rnn, "head": head})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = None
    for _ in range(steps):
        with contextlib.suppress(RuntimeError):
            with gp.diagnose_step(model, optimizer, show=False) as step:
                out, state = rnn(torch.ones(2, 5, 3), carry(state))
                optimizer.zero_grad()
                head(out[:, -1]).pow(2).mean().backward()
                optimizer.step()
        if step.error:
            break
    return step


def test_a_second_backward_names_the_state_carried_in_from_the_step_before():
    kept = _rnn_steps(lambda state: state)
    assert "Trying to backward through the graph a second time" in kept.error
    here = kept.explained.split("Here: ")[1]
    assert here.startswith("state[0], state[1] came into this step still holding an earlier")
    assert here.endswith("(state = tuple(t.detach() for t in state))")
    detached = _rnn_steps(lambda s: s if s is None else tuple(t.detach() for t in s), steps=3)
    assert detached.error == "" and detached.problems == {}


def test_a_second_backward_of_the_same_loss_names_no_carried_state():
    model = small_model()
    with contextlib.suppress(RuntimeError):
        with gp.diagnose_step(model, show=False) as step:
            loss = model(INPUTS).pow(2).mean()
            loss.backward()
            loss.backward()
    assert "second time" in step.error and "Here:" not in step.explained


def test_a_leaf_scaled_at_creation_gets_the_make_it_last_fix_first():
    w = torch.randn(3, requires_grad=True) * 0.01  # the classic init bug
    fix = gp.why_no_grad((w * X).sum(), w).sentence.split(": ", 1)[1]
    assert fix.startswith("if w is meant to be trained, create it as a leaf")


# --- the advice for three mistakes a training step makes ---------------------------


def _linear_step(model, inputs=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        model(torch.ones(2, 3) if inputs is None else inputs).sum().backward()
        optimizer.step()
    return step


def test_a_requires_grad_attribute_on_a_module_is_named_as_freezing_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].requires_grad = False  # the mistake: an attribute, not requires_grad_()
    step = _linear_step(model)
    assert step.problems == {}  # every parameter trains, as PyTorch does
    assert [n for n in step.notes if "model[0].requires_grad_(False)" in n]
    model[0].requires_grad_(False)
    del model[0].requires_grad
    assert not [n for n in _linear_step(model).notes if "plain attribute" in n]


def test_grad_mode_left_off_before_the_step_is_named():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    torch.set_grad_enabled(False)  # the mistake: a bare call, not a with statement
    try:
        with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
            with gp.diagnose_step(model, show=False) as step:
                model(torch.ones(2, 3)).sum().backward()
    finally:
        torch.set_grad_enabled(True)
    assert [n for n in step.notes if "already off when the block began" in n]
    assert not [n for n in _linear_step(model).notes if "already off" in n]


def test_grad_mode_note_is_there_when_it_is_off():
    assert "set_grad_enabled(False)" in diagnosis.step._grad_mode_note(False)[0]
    assert diagnosis.step._grad_mode_note(True) == ()


@pytest.mark.parametrize(
    "name, container",
    [
        ("layers[0]", "nn.ParameterList"),
        ("blocks[1].weight", "nn.ModuleList"),
        ("w", "nn.Parameter"),
    ],
)
def test_an_unregistered_tensor_gets_the_container_that_registers_it(name, container):
    from gradstop.diagnosis.sentences import _unregistered_fix

    assert container in _unregistered_fix(name)


def _half_frozen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    model[0].requires_grad_(False)
    return model


def test_a_frozen_layer_is_its_own_line_not_a_problem():
    model = _half_frozen()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with gp.diagnose_step(model, opt, show=False) as step:
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    assert step.problems == {}
    text = str(step)
    assert "Frozen (requires_grad=False" in text and "0.weight, 0.bias" in " ".join(text.split())
    assert "changed it): 2.weight, 2.bias" in text
    assert "The optimizer was given" not in text  # it holds only what trains
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # the frozen layer too
    with gp.diagnose_step(model, opt, show=False) as step:
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    assert step.problems == {}
    assert "The optimizer was given them: if any should train" in " ".join(str(step).split())


def test_a_frozen_parameter_is_marked_frozen_in_grad_report():
    model = _half_frozen()
    loss = model(torch.ones(2, 3)).sum()
    loss.backward()
    found = gp.grad_report(loss, model)
    frozen = {r.name for r in found.rows if r.frozen}
    assert frozen == {"0.weight", "0.bias"}
    assert "0.weight: frozen, NO_REQUIRES_GRAD" in repr(found)


def test_a_tensor_that_is_not_a_parameter_is_not_called_frozen():
    # a plain tensor without requires_grad is a mistake to report, not a frozen layer
    w = torch.ones(3)
    with gp.diagnose_step(tensors={"w": w}, show=False) as step:
        loss = (w * 2).sum() + torch.ones(1, requires_grad=True).sum()
        loss.backward()
    assert "w" in step.problems and "Frozen" not in str(step)


class _SwishIgnoringGradOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_output):  # the bug: grad_output is never used
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return s * (1 + x * (1 - s))


def test_a_custom_function_on_the_path_gets_the_gradcheck_note():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    with gp.diagnose_step(model, show=False) as step:
        (_SwishIgnoringGradOutput.apply(model(torch.ones(2, 3))) * 5).sum().backward()
    # it never reads grad_output: the note says so, with the fix and the gradcheck
    notes = [n for n in step.notes if n.startswith("_SwishIgnoringGradOutput.backward() never")]
    assert notes and "torch.autograd.gradcheck(_SwishIgnoringGradOutput.apply" in notes[0]
    # what the note says: the wrong formula raised nothing, and gradcheck finds it
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    from torch.autograd.gradcheck import GradcheckError

    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(_SwishIgnoringGradOutput.apply, (x,))

    # and a gradient of the wrong shape is refused: the one check autograd makes
    class WrongShape(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output[:1]

    with pytest.raises(RuntimeError, match="returned an invalid gradient at index 0"):
        WrongShape.apply(torch.ones(3, requires_grad=True)).sum().backward()
    assert not [n for n in _linear_step(nn.Linear(3, 1)).notes if "custom autograd" in n]


def test_a_nan_gradient_from_a_finite_loss_gets_the_where_note():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)

    def distances(e, safe):
        sq = ((e[:, None, :] - e[None, :, :]) ** 2).sum(-1)
        if safe:  # the input made safe before sqrt
            return torch.where(sq > 0, torch.sqrt(torch.where(sq > 0, sq, 1.0)), 0.0)
        return torch.where(sq > 0, torch.sqrt(sq), torch.zeros_like(sq))

    said_by = {}
    for safe in (False, True):
        model.zero_grad()
        with gp.diagnose_step(model, show=False) as step:
            loss = distances(model(torch.randn(4, 3)), safe).mean()
            loss.backward()
        assert torch.isfinite(loss)
        nan = not torch.isfinite(model.weight.grad).all()
        assert nan is not safe  # the unsafe form gives NaN, the safe one does not
        said_by[safe] = [n for n in step.notes if ".grad holds NaN or inf" in n]
        # a NaN gradient arrived, but "Fine" would reassure falsely: a row of its own
        assert set(step.problems) == (set() if safe else {"weight", "bias"})
    assert said_by[True] == [] and len(said_by[False]) == 1
    assert "set_detect_anomaly(True)" in said_by[False][0]
    assert "f(torch.where(cond, x, safe))" in said_by[False][0]


def test_a_penalty_autograd_grad_in_the_step_is_not_taken_for_the_loss():
    # bug set 5: the report read the penalty's autograd.grad() as a backward that fills
    # no .grad (NOT_ACCUMULATED, false); the backward() that ran is the loss
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    points = torch.randn(6, 2).requires_grad_(True)
    with gp.diagnose_step(critic, show=False) as step:
        (slopes,) = torch.autograd.grad(critic(points).sum(), points)  # no create_graph
        loss = critic(points).mean() + ((slopes.norm(dim=1) - 1) ** 2).mean()
        loss.backward()
    assert step.losses == ("loss",)
    assert set(step.reasons.values()) == {diagnosis.Reason.PARTIAL}
    assert "pass create_graph=True to torch.autograd.grad" in step.problems["0.weight"]


def test_a_custom_function_returning_too_few_gradients_is_explained():
    class Reverse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.alpha = alpha
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad_output):
            return -ctx.alpha * grad_output  # the bug: no None for alpha

    model = nn.Linear(3, 1)
    with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
        with gp.diagnose_step(model, show=False) as step:
            Reverse.apply(model(torch.ones(2, 3)), 0.5).sum().backward()
    assert "one value per argument its forward() took after ctx" in step.explained


def test_an_explained_message_key_may_hold_one_varying_word():
    from gradstop.diagnosis.errors import _starts

    key = "function … returned an incorrect number of gradients"
    assert _starts("function ReverseBackward returned an incorrect number of gradients (2)", key)
    assert not _starts("function My Backward returned an incorrect number of gradients", key)
    assert _starts("Can't detach views in-place", "Can't detach")  # no "…": a plain start


# --- bug set 5's open findings (issue 26): each checked against what PyTorch does


def test_an_indexed_assignment_into_a_saved_output_is_named_as_the_in_place_change(capsys):
    torch.manual_seed(0)
    model = nn.Linear(3, 4)
    with pytest.raises(RuntimeError, match="output 0 of Sigmoid"):
        with gp.diagnose_step(model):
            gate = torch.sigmoid(model(INPUTS))
            gate[INPUTS[:, :1].expand(-1, 4) > 0] = 0.0  # sigmoid saved its output
            gate.sum().backward()
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "sigmoid() saved gate; then an indexed assignment, x[index] = value, which writes"
        in printed
    ), printed
    assert "masked_fill()" in printed and "line" in printed
    # rows the crashed backward never reached say so, not "read it after a backward()"
    assert "the block raised (above) before a backward() filled its .grad" in printed
    # the out-of-place form it names runs
    gate = torch.sigmoid(model(INPUTS)).masked_fill(INPUTS[:, :1].expand(-1, 4) > 0, 0.0)
    gate.sum().backward()
    assert model.weight.grad is not None


def test_a_forward_hook_that_returns_a_detached_output_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    kept = {}

    def keep(module, inputs, output):
        kept["out"] = output.detach()
        return kept["out"]  # replaces the module's output

    handle = model[0].register_forward_hook(keep)
    step = _linear_step(model)
    handle.remove()
    problem = step.problems["0.weight"]
    assert step.reasons["0.weight"] is Reason.DETACHED
    assert "in the forward hook keep(): a forward hook's return value" in problem, problem
    # what it says: returning nothing leaves the output, and its gradient, alone
    model[0].register_forward_hook(lambda m, i, o: kept.update(out=o.detach()))
    model(torch.ones(2, 3)).sum().backward()
    assert model[0].weight.grad is not None


def test_a_non_leaf_weight_in_a_step_gets_the_leaf_fix_and_no_warning(recwarn):
    w = torch.randn(3, 1, requires_grad=True) * 0.01
    with gp.diagnose_step(tensors={"w": w}, show=False) as step:
        (torch.ones(2, 3) @ w).sum().backward()  # frees what MulBackward0 saved
    problem = step.problems["w"]
    assert problem.index("if w is meant to be trained") < problem.index("retain_grad()")
    assert "not a parameter to train" in problem
    assert not [x for x in recwarn if "not a leaf Tensor is being accessed" in str(x.message)]


def test_a_custom_function_heading_covers_only_the_parameters_behind_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with gp.diagnose_step(model, show=False) as step:
        model[1](_SwishIgnoringGradOutput.apply(model[0](torch.ones(2, 3)))).sum().backward()
    assert step.behind == {"0.weight", "0.bias"}
    printed = str(step)
    assert "A gradient arrived, through _SwishIgnoringGradOutput" in printed
    assert "Fine (the gradient arrived): 1.weight, 1.bias" in printed


def test_a_ddp_model_called_through_module_is_named(tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = nn.parallel.DistributedDataParallel(small_model())
        notes = lambda call: [  # noqa: E731
            n for n in _ddp_step(model, call).notes if "DistributedDataParallel" in n
        ]
        assert notes(model.module) and "ddp_model(x)" in notes(model.module)[0]
        assert not notes(model)
    finally:
        dist.destroy_process_group()


def _ddp_step(model, call):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        call(INPUTS).sum().backward()
        optimizer.step()
    return step


def test_hooks_made_in_a_loop_that_read_one_variable_are_named():
    model = small_model()
    for scale in (0.1, 1.0):
        for p in model[0].parameters():  # every hook reads `scale` when it runs
            p.register_hook(lambda grad: grad * scale)  # noqa: B023
    late = [n for n in _linear_step(model, torch.ones(2, 3)).notes if "reads scale" in n]
    assert late and "(now 1.0)" in late[0] and "scale=scale" in late[0]
    # what it says: each hook multiplied by the last value, 1.0, never by 0.1
    plain = small_model()
    plain.load_state_dict(model.state_dict())  # the same weights, no hooks
    plain(torch.ones(2, 3)).sum().backward()
    model.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    for (_, p), (_, q) in zip(model.named_parameters(), plain.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    bound = small_model()  # bound as a default argument: not reported
    for p in bound[0].parameters():
        p.register_hook(lambda grad, scale=0.1: grad * scale)
    assert not [n for n in _linear_step(bound, torch.ones(2, 3)).notes if "reads scale" in n]


def test_a_hand_written_step_that_resets_grad_is_fine_and_one_that_never_updates_is_not():
    def step(update):
        w = torch.zeros(3, 1, requires_grad=True)
        with gp.diagnose_step(tensors={"w": w}, show=False) as found:
            (torch.ones(2, 3) @ w - 1).pow(2).sum().backward()
            with torch.no_grad():
                if update:
                    w -= 0.1 * w.grad
            w.grad = None  # the usual reset after a hand-written update
        return found, w

    found, w = step(update=True)
    assert "w" not in found.problems and not torch.equal(w, torch.zeros(3, 1))
    found, _ = step(update=False)  # read, reset, never used: still reported
    assert found.reasons["w"] is Reason.NOT_YET and "w" in found.problems


def test_diagnose_step_names_a_zero_grad_that_cleared_the_gradients_before_use():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.zero_grad()
        optimizer.step()
    assert {r.verdict for r in step.rows} == {
        "backward() filled its .grad, then zero_grad() cleared it"
    }
    assert all("before optimizer.step()" in text for text in step.problems.values())
    assert not any("no backward() has filled" in text for text in step.problems.values())
    with gp.diagnose_step(model, optimizer, show=False) as step:  # the usual order
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not step.problems and {r.changed for r in step.rows} == {True}


def test_diagnose_step_names_a_requires_grad_comparison_that_does_nothing(tmp_path):
    script = tmp_path / "freeze.py"
    script.write_text(
        "import torch, gradstop as gp\n"
        "model = torch.nn.Linear(3, 1)\n"
        "for p in model.parameters():\n"
        "    p.requires_grad == False\n"
        "with gp.diagnose_step(model, show=False) as step:\n"
        "    model(torch.ones(2, 3)).sum().backward()\n"
        "print(repr(step.notes))\n"
    )
    printed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True
    ).stdout
    assert "`p.requires_grad == False`" in printed and "line 4" in printed
    assert "`p.requires_grad = False`" in printed
    model = small_model()
    with gp.diagnose_step(model, show=False) as step:  # this file holds no such statement
        model(INPUTS).sum().backward()
    assert not any("compares and throws" in n for n in step.notes)


def test_diagnose_step_reports_an_input_that_requires_grad_as_data_not_a_parameter():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = INPUTS.clone().requires_grad_()
    scale = torch.ones(1, requires_grad=True)  # read by the loss, not passed to the model
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        loss = (model(batch) * scale - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.step()
    assert "batch" not in step.reasons and step.reasons["scale"] is Reason.UNREGISTERED
    assert any(n.startswith("batch: passed to the model as input") for n in step.notes)
    assert batch.grad is not None  # the note's claim: backward() filled it


def test_diagnose_step_names_each_losss_cut_when_no_loss_reaches_a_parameter():
    # a GAN whose generator loss also goes through fake.detach(): the cut in d_loss is
    # meant, the one in g_loss is the mistake, and the report must name both
    torch.manual_seed(0)
    generator, critic = nn.Linear(2, 2), nn.Linear(2, 1)
    g_optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
    with gp.diagnose_step(generator, g_optimizer, show=False) as step:
        fake = generator(torch.randn(4, 2))
        d_loss = critic(fake.detach()).mean()
        d_loss.backward()
        g_loss = -critic(fake.detach()).mean()
        g_loss.backward()
        g_optimizer.step()
    assert set(step.reasons.values()) == {Reason.DETACHED}
    text = step.problems["weight"]
    assert "[d_loss]" in text and "[g_loss]" in text
    lines = [int(n) for n in re.findall(r"line (\d+)", text)]
    assert len(lines) == 2 and lines[0] < lines[1]


def test_diagnose_step_names_round_when_every_gradient_is_zero():
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        loss = (torch.sigmoid(model(INPUTS)).round() - TARGETS).pow(2).mean()
        loss.backward()
        optimizer.step()
    assert {r.changed for r in step.rows} == {False}
    assert {r.verdict for r in step.rows} == {
        "its gradient was all zeros, so optimizer.step() did not move it"
    }
    assert all("passes through round()" in text for text in step.problems.values())
    with gp.diagnose_step(model, optimizer, show=False) as step:  # zero, and no flat op
        optimizer.zero_grad()
        (model(INPUTS) * 0).sum().backward()
        optimizer.step()
    # no flat operation, and the model's relu() passes a gradient: it is not blamed
    assert all("look at each operation between" in text for text in step.problems.values())
    assert not any("passes through relu()" in text for text in step.problems.values())


def _zero_step(forward):
    torch.manual_seed(0)
    scorer = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(scorer.parameters(), lr=0.1)
    with gp.diagnose_step(scorer, optimizer, show=False) as step:
        optimizer.zero_grad()
        forward(scorer).backward()
        optimizer.step()
    return step


def test_a_softmax_over_a_size_one_dimension_is_named_for_zero_gradients():
    frames = torch.randn(2, 5, 3)  # (batch, time, features): one score per frame
    wrong = _zero_step(lambda s: (torch.softmax(s(frames), dim=-1) * frames).sum())
    assert all(
        "softmax() of shape (2, 5, 1): a softmax over a dimension of size 1" in text
        for text in wrong.problems.values()
    )
    right = _zero_step(lambda s: (torch.softmax(s(frames), dim=1) * frames).sum())
    assert "weight" not in right.problems  # over time, the fix: a gradient arrives
    # (the bias's gradient is zero up to rounding there: a softmax ignores a shift)


def test_a_relu_is_named_for_zero_gradients_only_where_it_is_off_everywhere():
    inputs = -torch.ones(4, 3)
    off = _zero_step(lambda s: torch.relu(s(inputs) - 100).sum())
    assert all("passes through relu()" in text for text in off.problems.values())
    on = _zero_step(lambda s: (torch.relu(s(inputs) + 100) * 0).sum())
    assert not any("relu()" in text for text in on.problems.values())


def test_diagnose_step_reports_a_nan_gradient_as_a_problem_row():
    model = small_model()
    scale = torch.ones(1, requires_grad=True)
    with gp.diagnose_step(model, tensors={"scale": scale}, show=False) as step:
        counts = torch.zeros(len(INPUTS), 1)
        safe = torch.where(counts > 0, (scale * counts).log(), torch.zeros(()))
        (model(INPUTS) + safe).pow(2).mean().backward()
    assert step.problems["scale"].startswith("the note on NaN below")
    assert any("NaN or inf" in n for n in step.notes)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_diagnose_step_on_a_full_backward_hook_and_a_buffer_that_requires_grad():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 1)
            self.register_buffer("temperature", torch.ones(1, requires_grad=True))

        def forward(self, x):
            return self.layer(x) / self.temperature

    model = Scaled()
    model.layer.register_full_backward_hook(lambda m, gi, go: gi)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        optimizer.step()
    row = next(r for r in step.rows if r.name == "temperature")
    assert row.verdict == "a buffer, not a parameter"
    assert "self.temperature = nn.Parameter" in row.problem
    assert not step.unchecked  # PyTorch's own BackwardHookFunction is not the reader's code
    (note,) = [n for n in step.notes if "full backward hook" in n]
    assert "cannot change them" in note and "model.layer.weight.register_hook" in note


def test_diagnose_step_says_when_the_block_raised_before_backward_and_prints_repeats_once(
    capsys,
):
    model = small_model()
    with torch.inference_mode():
        frozen_input = INPUTS.clone()
    with pytest.raises(RuntimeError), gp.diagnose_step(model):
        model(frozen_input).sum().backward()
    printed = capsys.readouterr().out
    assert "raised before any backward() ran" in printed
    assert "Put loss.backward() inside" not in printed
    for _ in range(3):
        with gp.diagnose_step(model):
            model(INPUTS).sum().backward()
    printed = capsys.readouterr().out
    assert printed.count("diagnose_step: backward() from") == 1
    assert printed.count("the same report again") == 1
    with gp.diagnose_step(model):  # another block: printed, though the report is the same
        model(INPUTS).sum().backward()
    assert capsys.readouterr().out.count("diagnose_step: backward() from") == 1


def test_diagnose_step_sees_gradient_clipping_called_before_backward():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original = torch.nn.utils.clip_grad_norm_
    for early in (True, False):
        with gp.diagnose_step(model, optimizer, show=False) as step:
            optimizer.zero_grad()
            loss = (model(INPUTS) - TARGETS).pow(2).mean()
            if early:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            loss.backward()
            if not early:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        said = [n for n in step.notes if n.startswith("clip_grad_norm_() ran before")]
        assert len(said) == (1 if early else 0), early
    assert torch.nn.utils.clip_grad_norm_ is original  # unwrapped after the block


def test_clipping_imported_under_another_name_is_seen_and_not_called_fine():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original = clip_norm
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        loss = (model(INPUTS) - TARGETS).pow(2).mean()
        clip_norm(model.parameters(), 1.0)  # too early: .grad is None here
        loss.backward()
        optimizer.step()
    assert [n for n in step.notes if n.startswith("clip_grad_norm_() ran before")]
    text = " ".join(str(step).split())
    assert "but unclipped (see the note)" in text and "Fine (" not in text
    assert clip_norm is original  # the module's name is restored after the block


def test_a_nan_gradient_from_a_nan_loss_does_not_point_at_an_absent_note():
    model = small_model()
    with gp.diagnose_step(model, show=False) as step:
        (model(INPUTS) * float("inf")).sum().backward()
    assert all(text.startswith("the loss itself is NaN or inf") for text in step.problems.values())
    assert not any("NaN or inf, although the loss is finite" in n for n in step.notes)


def test_diagnose_step_tells_a_layer_left_out_of_the_groups_from_a_stale_optimizer():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    partial = torch.optim.SGD([{"params": model[1].parameters()}], lr=0.1)
    with gp.diagnose_step(model, partial, show=False) as step:
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        partial.step()
    left_out = {r.name: r.verdict for r in step.rows if r.problem}
    assert set(left_out) == {"0.weight", "0.bias"}
    assert set(left_out.values()) == {
        "the gradient arrives, but no param group of the optimizer lists it"
    }
    stale = torch.optim.SGD(model.parameters(), lr=0.1)
    model[1] = nn.Linear(4, 1)  # replaced after the optimizer was built
    with gp.diagnose_step(model, stale, show=False) as step:
        (model(INPUTS) - TARGETS).pow(2).mean().backward()
        stale.step()
    assert {r.verdict for r in step.rows if r.name in ("1.weight", "1.bias")} == {
        "the gradient arrives, but the optimizer does not hold it"
    }


def _reverse_and_forget(grad):
    grad = -grad  # rebinds the name only: the hook returns None


def _reverse(grad):
    return -grad


def _log_only(grad):
    print(grad.norm())  # returns nothing, and means to


@pytest.mark.parametrize(
    "hook, flagged", [(_reverse_and_forget, True), (_reverse, False), (_log_only, False)]
)
def test_diagnose_step_names_a_hook_whose_new_gradient_is_thrown_away(hook, flagged, capsys):
    model = small_model()
    with gp.diagnose_step(model, show=False) as step:
        hidden = model(INPUTS)
        hidden.register_hook(hook)
        hidden.sum().backward()
    said = [n for n in step.notes if "returns nothing, so the new value is thrown away" in n]
    assert len(said) == int(flagged)
    if flagged:
        assert "`return -grad`" in said[0] and "_reverse_and_forget" in said[0]


def test_a_second_derivative_without_create_graph_is_named_and_its_input_not_doubted():
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.linspace(0, 1, 5).unsqueeze(1).requires_grad_()
    with (
        pytest.raises(RuntimeError, match="element 0"),
        gp.diagnose_step(model, show=False) as step,
    ):
        u = model(x)
        du = torch.autograd.grad(u, x, torch.ones_like(u))[0]  # no create_graph=True
        torch.autograd.grad(du, x, torch.ones_like(du))
    assert "ran without create_graph=True" in step.explained
    assert not any(n.startswith("x: passed to the model") for n in step.notes)


def test_all_zero_gradients_behind_a_saturated_clamp_name_the_clamp():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model.bias.fill_(100.0)  # every output far above the clamp's upper bound
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        (model(INPUTS).clamp(0, 1) - 0.5).pow(2).mean().backward()
        optimizer.step()
    assert set(step.problems) == {"weight", "bias"}
    assert all("passes through clamp()" in text for text in step.problems.values())
    assert not any("relu" in text for text in step.problems.values())


def _one_step(model, optimizer, inputs, scheduler=None):
    with gp.diagnose_step(model, optimizer, show=False) as step:
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return step


def test_a_learning_rate_a_scheduler_set_to_zero_is_put_down_to_the_scheduler():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1, step // 10))
    problems = _one_step(model, optimizer, INPUTS, warmup).problems.values()
    assert problems and all("set by a learning-rate scheduler" in p for p in problems)
    plain = torch.optim.SGD(model.parameters(), lr=0.0)  # no scheduler: no such words
    problems = _one_step(model, plain, INPUTS).problems.values()
    assert problems and not any("scheduler" in p for p in problems)


def test_bfloat16_weights_the_step_barely_moves_are_a_problem_row():
    torch.manual_seed(0)
    model = nn.Linear(64, 32).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    step = _one_step(model, optimizer, torch.randn(8, 64, dtype=torch.bfloat16))
    assert step.problems["weight"].startswith("optimizer.step() changed only ")
    assert "keep the weights in float32 and compute in bfloat16" in step.problems["weight"]
    model = model.float()  # the same step in float32 moves every entry
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    assert _one_step(model, optimizer, torch.randn(8, 64)).problems == {}


def test_zero_grad_between_micro_batches_is_not_called_fine():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        for chunk in INPUTS.chunk(2):
            optimizer.zero_grad()  # inside the loop: the first chunk's gradient is lost
            model(chunk).pow(2).mean().backward()
        optimizer.step()
    text = " ".join(str(step).split())
    assert "but only from the backward() calls after the last zero_grad() (see the note)" in text
    assert "Fine (" not in text


def test_a_freezing_test_by_name_prefix_that_catches_layer_ten_is_named():
    model = nn.ModuleDict({"layers": nn.ModuleList(nn.Linear(3, 3) for _ in range(12))})
    for name, p in model.named_parameters():
        if name.startswith(("layers.0", "layers.1")):  # meant: layers 0 and 1
            p.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)

    def forward(x):
        for layer in model["layers"]:
            x = layer(x)
        return x

    with gp.diagnose_step(model, optimizer, show=False) as step:
        forward(INPUTS).sum().backward()
        optimizer.step()
    note = " ".join(n for n in step.notes if n.startswith("layers.1 is frozen"))
    assert "and so are layers.10 and layers.11, while layers.2 to layers.9 train" in note
    assert 'name.startswith("layers.1.")' in note
    for p in model.parameters():  # frozen by the modules themselves: no such note
        p.requires_grad_(True)
    for layer in model["layers"][:2]:
        layer.requires_grad_(False)
    with gp.diagnose_step(model, optimizer, show=False) as step:
        forward(INPUTS).sum().backward()
    assert not any(n.startswith("layers.") for n in step.notes)


def test_weights_written_into_a_module_through_data_are_named_with_functional_call():
    torch.manual_seed(0)
    target = nn.Linear(3, 1)
    generator = nn.Linear(2, 4)  # makes the target's 3 weights and 1 bias
    code = torch.ones(2)
    with gp.record() as rec:
        flat = generator(code)
        nn.utils.vector_to_parameters(flat, target.parameters())
        loss = target(INPUTS).sum()
    found = gp.why_no_grad(loss, generator.weight, recording=rec)
    assert found.reason is Reason.DATA
    assert "cut at an assignment to .data (p.data = value)" in found.sentence
    assert "inside torch.nn.utils.convert_parameters.vector_to_parameters()" in found.sentence
    assert "torch.func.functional_call(module, {name: tensor}, inputs)" in found.sentence
    # the fix it names: the generated weights reach the loss, and the generator trains
    weights = {"weight": flat[:3].view(1, 3), "bias": flat[3:]}
    torch.func.functional_call(target, weights, (INPUTS,)).sum().backward()
    assert generator.weight.grad is not None and generator.weight.grad.any()


class _CachedScale(nn.Module):
    """A result computed from a parameter once and kept: the second step's backward
    runs into the first step's freed graph."""

    def __init__(self):
        super().__init__()
        self.raw = nn.Parameter(torch.ones(3))
        self._scale = None

    def forward(self, x):
        if self._scale is None:
            self._scale = torch.sigmoid(self.raw)
        return self.linear_part(x) * self._scale

    def linear_part(self, x):
        return x * 2


def test_a_second_backward_names_a_cached_tensor_the_model_kept_and_says_recompute():
    model = _CachedScale()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with contextlib.suppress(RuntimeError):
            with gp.diagnose_step(model, optimizer, show=False) as step:
                model(INPUTS).sum().backward()
                optimizer.step()
    assert "second time" in step.error
    here = " ".join(step.explained.split("Here: ")[1].split())
    assert here.startswith("_scale, held by the model, was computed in an earlier step and kept")
    assert "compute it again in each step, inside the forward pass" in here
    assert "detach" not in here.split("Detaching")[0]  # not the RNN advice


class _SquareForgetful(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return 2 * x  # forgets grad_out: the chain rule's factor


class _SquareRight(_SquareForgetful):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_out


def test_a_custom_backward_that_never_reads_its_gradient_is_called_wrong():
    for function, wrong in ((_SquareForgetful, True), (_SquareRight, False)):
        model = small_model()
        with gp.diagnose_step(model, show=False) as step:
            (function.apply(model(INPUTS)) * 3).sum().backward()
        text = " ".join(str(step).split())
        said = f"{function.__name__}.backward() never reads the gradient it is handed (grad_out)"
        assert (said in text) is wrong, function
        assert ("ignores grad_output, so it is wrong" in text) is wrong
        assert ("its value is not checked" in text) is not wrong


def _ema_step(update):
    torch.manual_seed(0)
    student = small_model()
    ema = copy.deepcopy(student).requires_grad_(False)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    named = {f"ema.{k}": v for k, v in ema.named_parameters()}
    with gp.diagnose_step(student, optimizer, tensors=named, show=False) as step:
        optimizer.zero_grad()
        student(INPUTS).pow(2).mean().backward()
        optimizer.step()
        with torch.no_grad():
            update(ema, student)
    return step


def test_a_named_tensor_an_ema_update_never_wrote_is_a_problem_row():
    def rebinds(ema, student):  # the bug: a new tensor into the state_dict's dict
        state = ema.state_dict()
        for key, value in student.state_dict().items():
            state[key] = 0.9 * state[key] + 0.1 * value

    def writes(ema, student):
        for e, s in zip(ema.parameters(), student.parameters(), strict=True):
            e.mul_(0.9).add_(s, alpha=0.1)

    wrong = _ema_step(rebinds).problems
    assert set(wrong) >= {"ema.0.weight", "ema.2.weight"}
    assert all("assigning a new tensor to a state_dict() entry" in wrong[k] for k in wrong)
    written = _ema_step(writes)
    assert not any(k.startswith("ema.") for k in written.problems)
    assert "Updated in place, without a gradient" in " ".join(str(written).split())


def test_a_bias_that_feeds_a_batchnorm_is_named_as_such_when_the_step_leaves_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = _one_step(model, optimizer, torch.randn(16, 3))
    assert list(step.problems) == ["0.bias"]  # its gradient is rounding: the step left it
    assert "a bias that feeds a BatchNorm gets no gradient" in step.problems["0.bias"]
    from gradstop.diagnosis.step import _feeds_batchnorm

    assert _feeds_batchnorm("0.bias", model) and not _feeds_batchnorm("3.bias", model)
    assert not _feeds_batchnorm("0.weight", model) and not _feeds_batchnorm("bias", None)
    nested = nn.ModuleDict({"block": model})
    assert _feeds_batchnorm("block.0.bias", nested)


class _TiedScores(nn.Module):
    """Scores against every item's embedding, then a lookup with max_norm: the lookup
    renormalises the weight in place, after the product saved it."""

    def __init__(self, clone):
        super().__init__()
        self.items = nn.Embedding(20, 4, max_norm=1.0)
        self.clone = clone

    def forward(self, history, target):
        user = self.items(history).mean(dim=1)
        weight = self.items.weight.clone() if self.clone else self.items.weight
        return (user @ weight.t()).sum() + self.items(target).sum()


def test_a_write_inside_an_operation_is_named_embedding_max_norm():
    torch.manual_seed(0)
    history, target = torch.randint(0, 20, (3, 5)), torch.randint(0, 20, (3,))
    model = _TiedScores(clone=False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with gp.diagnose_step(model, show=False) as step:
            model(history, target).backward()
    here = " ".join(step.explained.split("Here: ")[1].split())
    assert here.startswith("matmul() saved items.weight (a view of it, shape [4, 20]); then ")
    assert "embedding() (in `self.items(target)`" in here
    model = _TiedScores(clone=True)
    with gp.diagnose_step(model, show=False) as step:
        model(history, target).backward()
    assert step.error == ""


def test_clipping_to_a_limit_of_zero_is_named_for_zero_gradients():
    for limit, named in ((0.0, True), (1.0, False)):
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with gp.diagnose_step(model, optimizer, show=False) as step:
            optimizer.zero_grad()
            model(INPUTS).pow(2).mean().backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=limit)
            optimizer.step()
        said = [t for t in step.problems.values() if "clip_grad_norm_() with max_norm=0" in t]
        assert bool(said) is named, limit
        assert norm > 0  # the norm from before clipping, as the sentence says


def test_a_learning_rate_a_scheduler_decayed_to_nothing_is_named():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    per_epoch = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(16):  # a per-epoch schedule stepped every batch
            per_epoch.step()
    problems = _one_step(model, optimizer, INPUTS).problems.values()
    assert problems and all("down from the initial_lr 0.1" in p for p in problems)


def test_a_penalty_computed_from_state_dict_is_named_with_named_parameters():
    model = small_model()
    with gp.record() as rec:
        penalty = sum(t.abs().sum() for k, t in model.state_dict().items() if "weight" in k)
        loss = model(INPUTS).pow(2).mean() + penalty
    found = gp.why_no_grad(loss, model[0].weight, recording=rec)
    assert found.reason is Reason.PARTIAL
    assert "state_dict() hands out detached tensors" in found.sentence
    kept = sum(t.abs().sum() for k, t in model.state_dict(keep_vars=True).items() if "weight" in k)
    assert kept.requires_grad  # the fix it names keeps the graph


def test_a_module_shared_by_two_heads_and_frozen_through_one_is_named():
    torch.manual_seed(0)
    neck = nn.Linear(3, 3)
    model = nn.ModuleDict(
        {
            "neck": neck,
            "aux": nn.Sequential(neck, nn.Linear(3, 1)),
            "main": nn.Sequential(neck, nn.Linear(3, 1)),
        }
    )
    model["aux"].requires_grad_(False)  # meant: the aux head only
    with gp.diagnose_step(model, show=False) as step:
        (model["main"](INPUTS) + model["aux"](INPUTS)).sum().backward()
    note = " ".join(n for n in step.notes if n.startswith("neck is also"))
    assert "neck is also aux.0 and main.0: one module in 3 places" in note


def test_an_embedding_padding_row_is_noted_and_a_plain_embedding_is_not():
    for padding, noted in ((0, True), (None, False)):
        torch.manual_seed(0)
        model = nn.Embedding(5, 2, padding_idx=padding)
        with gp.diagnose_step(model, show=False) as step:
            model(torch.tensor([0, 1, 0, 3])).sum().backward()
        said = [n for n in step.notes if "by design (padding_idx=0)" in n]
        assert bool(said) is noted
        if noted:
            assert model.weight.grad[0].abs().sum() == 0  # what the note says
