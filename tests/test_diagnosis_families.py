"""Each rule of gradstop.diagnosis over a family of cases that could refute it (issue 26).

tests/test_diagnosis.py has one case per verdict; here each verdict meets its
variants, and the truth of every case is computed from what PyTorch does (a
gradient compared with the one of a twin without the bug), never typed in.
"""

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import gradstop as gp
from gradstop.diagnosis import Reason

X = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])


def leaf():
    return torch.tensor([0.5, -1.0, 2.0], requires_grad=True)


# --- 1. A loss with no graph at all, read from the recording.

NO_GRAPH = {
    "torch.tensor(list)": ("torch.tensor(losses).sum()", Reason.COPIED),
    "torch.as_tensor(list)": ("torch.as_tensor(losses).sum()", Reason.COPIED),
    "torch.asarray(list)": ("torch.asarray(losses).sum()", Reason.COPIED),
    "new_tensor(list)": ("losses[0].new_tensor(losses).sum()", Reason.COPIED),
    "argmax": ("torch.stack(losses).argmax().float()", Reason.NOT_DIFFERENTIABLE),
    "comparison": ("(torch.stack(losses) > 1).float().sum()", Reason.NOT_DIFFERENTIABLE),
    "detach": ("torch.stack(losses).detach().sum()", Reason.DETACHED),
    ".data": ("torch.stack(losses).data.sum()", Reason.DATA),
    "item then tensor": ("torch.tensor([v.item() for v in losses]).sum()", Reason.LEFT_TORCH),
    "numpy then from_numpy": (
        "torch.from_numpy(np.exp(torch.stack(losses).detach().numpy())).sum()",
        Reason.LEFT_TORCH,
    ),
}


@pytest.mark.parametrize("case", NO_GRAPH, ids=list(NO_GRAPH))
def test_a_loss_with_no_graph_is_read_from_the_recording(case):
    make, reason = NO_GRAPH[case]
    w = leaf()
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(list of tensors) warns once
        losses = [(w * row - 1).pow(2).sum() for row in X]
        loss = eval(make, {"torch": torch, "np": np, "losses": losses})
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
        loss.backward()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is reason, found
    assert "raises 'element 0 of tensors does not require grad" in found.sentence
    if reason in (Reason.COPIED, Reason.LEFT_TORCH):
        assert "torch.stack" in found.sentence  # the fix that keeps the graph


@pytest.mark.parametrize(
    "region, mode",
    [
        (torch.no_grad, "no_grad()"),
        (torch.inference_mode, "inference_mode()"),
        (lambda: torch.set_grad_enabled(False), "no_grad()"),
    ],
    ids=["no_grad", "inference_mode", "set_grad_enabled(False)"],
)
def test_a_loss_computed_with_recording_off_names_the_region(region, mode):
    w = leaf()
    with gp.record() as rec:
        with region():
            loss = (w * X).sum()
    assert loss.grad_fn is None
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NO_GRAD and mode in found.sentence


# --- 2. The gradient arrives, but a path is cut: the wrong value, not None.


def _kept(h):
    return h.tanh()


PARTIAL = {
    "detach": lambda h, keep: h * (h if keep else h.detach()),
    ".data": lambda h, keep: h * (h if keep else h.data),
    "numpy, torch.tensor": lambda h, keep: (
        h + (_kept(h) if keep else torch.tensor(np.tanh(h.detach().numpy())))
    ),
    "numpy, torch.from_numpy": lambda h, keep: (
        h + (_kept(h) if keep else torch.from_numpy(np.tanh(h.detach().numpy())))
    ),
    "item, torch.tensor": lambda h, keep: h * (h.sum() if keep else torch.tensor(h.sum().item())),
}


def _no_grad_branch(h, keep):
    if keep:
        return h * h.sum()
    with torch.no_grad():
        total = h.sum()
    return h * total


PARTIAL["no_grad() branch"] = _no_grad_branch


def _grad_of(build, keep):
    w = leaf()
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = build(w * X, keep).sum()
    loss.backward()
    return w, loss, rec


@pytest.mark.parametrize("case", PARTIAL, ids=list(PARTIAL))
def test_a_cut_beside_a_kept_path_is_partial_and_the_gradient_is_wrong(case):
    full, _, _ = _grad_of(PARTIAL[case], keep=True)
    w, loss, rec = _grad_of(PARTIAL[case], keep=False)
    assert w.grad is not None and not torch.allclose(w.grad, full.grad)  # silently wrong
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.PARTIAL and found.reached, found
    assert "holds only part of the gradient" in found.sentence
    assert "(and is cut on another path)" in " ".join(found.uses) or "came back" in found.sentence


class _Swish(torch.autograd.Function):  # a right custom Function: its backward decides
    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return h * torch.sigmoid(h)

    @staticmethod
    def backward(ctx, grad_out):
        (h,) = ctx.saved_tensors
        s = torch.sigmoid(h)
        return grad_out * s * (1 + h * (1 - s))


# Calls that make something off the graph beside a result that keeps it: none of them
# loses a part of the gradient (the tool called each of them PARTIAL before).
NOT_CUTS = {
    "max(dim): values kept, indices": lambda h: h.max(dim=1, keepdim=True).values * h,
    "sort: values kept, indices": lambda h: h.sort(dim=1).values + h,
    "topk: values kept, indices": lambda h: h.topk(2, dim=1).values.sum() * h,
    "where(h > 0, h, zeros_like(h))": lambda h: torch.where(h > 0, h, torch.zeros_like(h)),
    "masked_fill by a comparison": lambda h: h.masked_fill(h < 0, 0.0) * h,
    "a mask (h > 0).float()": lambda h: h * (h > 0).float(),
    "gather at argmax": lambda h: h.gather(1, h.argmax(dim=1, keepdim=True)) * h,
    "full_like and new_ones": lambda h: h + torch.full_like(h, 2.0) * h.new_ones(h.shape),
    "a right custom Function": lambda h: _Swish.apply(h),
}


@pytest.mark.parametrize("case", NOT_CUTS, ids=list(NOT_CUTS))
def test_an_off_graph_result_beside_a_kept_one_is_not_partial(case):
    w = leaf()
    with gp.record() as rec:
        loss = NOT_CUTS[case](w * X).sum()
    loss.backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.OK, found


def test_paths_that_are_all_kept_are_ok():
    w = leaf()
    with gp.record() as rec:
        h = w * X
        loss = (h + h.tanh()).sum()
    loss.backward()
    assert gp.why_no_grad(loss, w, recording=rec).reason is Reason.OK


def test_a_cut_on_another_tensor_is_not_a_partial_cut_of_this_one():
    w, target = leaf(), leaf()
    with gp.record() as rec:
        loss = ((w * X) - (target * X).detach()).pow(2).sum()
    loss.backward()
    assert gp.why_no_grad(loss, w, recording=rec).reason is Reason.OK
    assert gp.why_no_grad(loss, target, recording=rec).reason is Reason.DETACHED


# --- 3. Module backward hooks: HOOKED exactly when the hook changes the gradient.

MODULES = ["first", "second", "inner", "outer"]
PARAMS = ["0.weight", "1.0.weight", "1.1.weight"]


def _nested():
    torch.manual_seed(0)
    first, second, third = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 1)
    outer = nn.Sequential(first, nn.Sequential(second, third))
    return outer, {"first": first, "second": second, "inner": outer[1], "outer": outer}


def _zeroing(kind):
    if kind == "full":
        return lambda m, gin, gout: tuple(None if g is None else g * 0 for g in gin)
    return lambda m, gout: tuple(g * 0 for g in gout)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "graph only"])
@pytest.mark.parametrize("kind", ["full", "pre"])
@pytest.mark.parametrize("hooked", MODULES)
def test_a_module_hook_is_named_exactly_when_it_changes_the_gradient(hooked, kind, recorded):
    twin, _ = _nested()
    twin(X).sum().backward()
    outer, modules = _nested()
    if kind == "full":
        modules[hooked].register_full_backward_hook(_zeroing(kind))
    else:
        modules[hooked].register_full_backward_pre_hook(_zeroing(kind))
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Full backward hook is firing ..." (no input grad)
        loss = outer(X).sum()
        loss.backward()
    mine, plain = dict(outer.named_parameters()), dict(twin.named_parameters())
    for name in PARAMS:
        changed = not torch.allclose(mine[name].grad, plain[name].grad)
        found = gp.why_no_grad(loss, mine[name], recording=rec if recorded else None)
        assert (found.reason is Reason.HOOKED) == changed, (name, found)
        assert found.reason in (Reason.HOOKED, Reason.OK)


# --- A hook registered before an in-place change still runs.

IN_PLACE = {
    "mul_": lambda y: y.mul_(3),
    "+=": lambda y: y.__iadd__(1),
    "relu_": lambda y: y.relu_(),
    "clamp_": lambda y: y.clamp_(max=1.5),
    "relu(inplace=True)": lambda y: nn.functional.relu(y, inplace=True),
}


@pytest.mark.parametrize("case", IN_PLACE, ids=list(IN_PLACE))
def test_a_hook_registered_before_any_in_place_op_is_seen(case):
    grads = []
    for hook in (False, True):
        x = torch.tensor([1.0, 2.0, -3.0], requires_grad=True)
        with gp.record() as rec:
            y = x * 2
            if hook:
                y.register_hook(lambda grad: grad * 10)
            IN_PLACE[case](y)
            loss = y.sum()
        loss.backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0] * 10)  # the hook did run
    found = gp.why_no_grad(loss, x, recording=rec)
    assert found.reason is Reason.HOOKED and "registered before" in found.sentence, found


# --- Every copy constructor, in any code (the legacy ones too, without a source file).


@pytest.mark.parametrize(
    "make", ["torch.Tensor(losses)", "torch.FloatTensor(losses)", "torch.DoubleTensor(losses)"]
)
def test_a_legacy_constructor_without_a_source_line_still_gets_torch_stack(make):
    w, b = leaf(), torch.ones(1, requires_grad=True)
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = [(w * k).sum() for k in range(3)]
        total = eval(make, {"torch": torch, "losses": losses}).sum() * b
    found = gp.why_no_grad(total, w, recording=rec)
    assert found.reason in (Reason.COPIED, Reason.LEFT_TORCH)
    assert "torch.stack" in found.sentence


# --- Parametrized weights: the tensor read is fresh; the originals train.


class Symmetric(nn.Module):
    def forward(self, weight):
        return weight.triu() + weight.triu(1).T


PARAMETRIZE = {
    "weight_norm": nn.utils.parametrizations.weight_norm,
    "spectral_norm": nn.utils.parametrizations.spectral_norm,
    "orthogonal": nn.utils.parametrizations.orthogonal,
    "register_parametrization": lambda m: parametrize.register_parametrization(
        m, "weight", Symmetric()
    ),
}


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "graph only"])
@pytest.mark.parametrize("case", PARAMETRIZE, ids=list(PARAMETRIZE))
def test_every_parametrization_is_recomputed_and_names_the_originals(case, recorded):
    layer = PARAMETRIZE[case](nn.Linear(3, 3))
    with gp.record() as rec:
        loss = layer(X).sum()
    loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reading a non-leaf's .grad warns
        assert layer.weight.grad is None
    found = gp.why_no_grad(loss, layer.weight, recording=rec if recorded else None)
    assert found.reason is Reason.RECOMPUTED, found
    originals = dict(layer.parametrizations.weight.named_parameters())
    for name, p in originals.items():
        assert p.grad is not None and f"layer.parametrizations.weight.{name}" in found.sentence


def test_the_old_weight_norm_keeps_the_weight_it_used_a_non_leaf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of parametrizations
        layer = nn.utils.weight_norm(nn.Linear(3, 3))
    loss = layer(X).sum()
    loss.backward()
    assert gp.why_no_grad(loss, layer.weight).reason is Reason.NON_LEAF
    assert layer.weight_g.grad is not None and layer.weight_v.grad is not None


# --- Tensors the model does not register: found, named, and cleared once held.

SCALE = torch.ones(3, requires_grad=True)  # a global the forward pass reads


class Loose(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.head = kind, nn.Linear(3, 1)
        if kind == "list":
            self.blocks = [nn.Linear(3, 3)]
        elif kind == "tuple":
            self.blocks = (nn.Linear(3, 3),)
        elif kind == "dict":
            self.blocks = {"a": nn.Linear(3, 3)}
        elif kind == "nested list":
            self.sub = nn.Module()
            self.sub.blocks = [nn.Linear(3, 3)]
        elif kind == "tensor attribute":
            self.scale = torch.ones(3, requires_grad=True)
        elif kind == "list of tensors":
            self.scales = [torch.ones(3, requires_grad=True)]

    def forward(self, x):
        loose = {
            "list": lambda: self.blocks[0](x),
            "tuple": lambda: self.blocks[0](x),
            "dict": lambda: self.blocks["a"](x),
            "nested list": lambda: self.sub.blocks[0](x),
            "tensor attribute": lambda: x * self.scale,
            "list of tensors": lambda: x * self.scales[0],
            "global": lambda: x * SCALE,
        }
        return self.head(loose[self.kind]())


LOOSE = {
    "list": {"blocks[0].weight", "blocks[0].bias"},
    "tuple": {"blocks[0].weight", "blocks[0].bias"},
    "dict": {"blocks['a'].weight", "blocks['a'].bias"},
    "nested list": {"sub.blocks[0].weight", "sub.blocks[0].bias"},
    "tensor attribute": {"scale"},
    "list of tensors": {"scales[0]"},
    "global": {"SCALE"},
}


@pytest.mark.parametrize("kind", LOOSE, ids=list(LOOSE))
def test_grad_report_finds_every_kind_of_unregistered_tensor(kind):
    model = Loose(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(X).sum()
    report = gp.grad_report(loss, model, optimizer=optimizer)
    assert report.unregistered == LOOSE[kind], repr(report)
    assert {report.reasons[n] for n in LOOSE[kind]} == {Reason.UNREGISTERED}
    # What PyTorch does: each gets a gradient, and a step leaves it as it was.
    tensors = _tensors_named(model, LOOSE[kind])
    before = [t.detach().clone() for t in tensors]
    loss.backward()
    optimizer.step()
    assert all(
        t.grad is not None and torch.equal(t, b) for t, b in zip(tensors, before, strict=True)
    )
    # Once the optimizer holds them, none is flagged.
    held = torch.optim.SGD([*model.parameters(), *tensors], lr=0.1)
    cleared = gp.grad_report(model(X).sum(), model, optimizer=held)
    assert Reason.UNREGISTERED not in cleared.reasons.values(), repr(cleared)
    SCALE.grad = None


def _tensors_named(model, names):
    """The tensors behind the report's rows (to hand them to an optimizer)."""
    return [SCALE if n == "SCALE" else eval("model." + n, {"model": model}) for n in names]


def test_a_global_the_optimizer_holds_is_not_flagged():
    model = Loose("global")
    optimizer = torch.optim.SGD([*model.parameters(), SCALE], lr=0.1)
    report = gp.grad_report(model(X).sum(), model, optimizer=optimizer)
    assert not report.unregistered and "SCALE" not in report.reasons


def test_diagnose_step_names_a_global_the_optimizer_does_not_hold(capsys):
    model = Loose("global")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = SCALE.detach().clone()
    with gp.diagnose_step(model, optimizer):
        loss = model(X).sum()
        loss.backward()
        optimizer.step()
    assert torch.equal(SCALE, before) and SCALE.grad is not None  # gets a gradient, never moves
    SCALE.grad = None
    printed = capsys.readouterr().out
    assert "SCALE: reached; not a registered parameter (UNREGISTERED)" in printed


# --- Checkpointing in both flavours: None exactly when the reentrant one had no input
# that required grad.

CHECKPOINTS = {
    "reentrant, input without grad": (
        lambda block, x: checkpoint(block, x, use_reentrant=True),
        False,
    ),
    "checkpoint_sequential, reentrant": (
        lambda block, x: checkpoint_sequential(block, 2, x, use_reentrant=True),
        False,
    ),
    "reentrant, input with grad": (
        lambda block, x: checkpoint(block, x, use_reentrant=True),
        True,
    ),
    "non-reentrant": (lambda block, x: checkpoint(block, x, use_reentrant=False), False),
}


@pytest.mark.parametrize("case", CHECKPOINTS, ids=list(CHECKPOINTS))
def test_checkpointing_is_cut_exactly_when_pytorch_gives_none(case):
    run, input_grad = CHECKPOINTS[case]
    block, head = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)), nn.Linear(3, 1)
    x = X.clone().requires_grad_(input_grad)
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True"
        loss = head(run(block, x)).sum()
    loss.backward()
    found = gp.why_no_grad(loss, block[0].weight, recording=rec)
    if block[0].weight.grad is None:
        assert found.reason is Reason.CHECKPOINTED and "use_reentrant=False" in found.sentence
    else:
        assert found.reason is Reason.OK, found


# --- The manual update, in every spelling: a non-leaf whose fix is in place under no_grad.

UPDATES = [
    "w = w - 0.1 * w.grad",
    "w = w.sub(0.1 * w.grad)",
    "w = torch.sub(w, w.grad, alpha=0.1)",
    "g = w.grad\nw = w - 0.1 * g",
    "w = w - 0.1 * w.grad.clamp(-1, 1)",
    "w = w * 0.99 - 0.1 * w.grad",
]


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "graph only"])
@pytest.mark.parametrize("update", UPDATES)
def test_every_manual_update_gets_the_in_place_no_grad_fix(update, recorded):
    w = leaf()
    with gp.record() as rec:
        ((w * X).sum() - 1).pow(2).backward()
        space = {"w": w, "torch": torch}
        exec(update, space)
        w = space["w"]
        loss = ((w * X).sum() - 1).pow(2)
    loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert w.grad is None and not w.is_leaf  # what PyTorch does: the second step fails
    found = gp.why_no_grad(loss, w, recording=rec if recorded else None)
    if not recorded and update.startswith("w = w * 0.99"):
        # two steps from the leaf: without the recording the graph cannot see a .grad read
        assert found.reason is Reason.NON_LEAF
        return
    assert found.reason is Reason.NON_LEAF, found
    fix = found.sentence.split(": ", 1)[1]
    assert "torch.no_grad()" in fix and "retain_grad() is not the fix" in fix
    assert fix.index("torch.no_grad()") < fix.index("retain_grad() is not the fix")


# --- autograd.grad and inputs=: .grad is left alone by design.

PASSES = {
    "autograd.grad(loss, w)": lambda loss, w, b: torch.autograd.grad(loss, w),
    "autograd.grad(loss, [b])": lambda loss, w, b: torch.autograd.grad(loss, [b]),
    "autograd.grad(create_graph=True)": lambda loss, w, b: torch.autograd.grad(
        loss, w, create_graph=True
    ),
    "backward(inputs=[b])": lambda loss, w, b: loss.backward(inputs=[b]),
    "autograd.backward(inputs=b)": lambda loss, w, b: torch.autograd.backward(loss, inputs=b),
}


@pytest.mark.parametrize("case", PASSES, ids=list(PASSES))
def test_a_pass_that_fills_no_grad_for_w_is_not_accumulated(case):
    w, b = leaf(), torch.zeros(1, requires_grad=True)
    with gp.record() as rec:
        loss = ((w * X).sum() + b).pow(2).sum()
        PASSES[case](loss, w, b)
    assert w.grad is None
    found = gp.why_no_grad(loss, w, recording=rec)
    assert found.reason is Reason.NOT_ACCUMULATED, found
    words = "use the values it returns" if "grad(" in case else "not among them"
    assert words in found.sentence
    if b.grad is not None:
        assert gp.why_no_grad(loss, b, recording=rec).reason is Reason.OK


def test_the_twin_of_a_model_is_not_reported_as_loose_tensors():
    model = nn.Linear(3, 1)
    twin = copy.deepcopy(model)
    with gp.record() as rec:
        loss = twin(X).sum()
    report = gp.grad_report(loss, model, recording=rec)
    assert not report.unregistered and set(report.reasons.values()) == {Reason.UNUSED}


def test_a_constant_offset_of_a_leaf_with_a_grad_is_not_called_a_manual_update():
    w = leaf()
    (w * X).sum().backward()  # w.grad is filled: [1.5, 1.0, 6.0], all positive
    shifted = w - 0.5  # a constant step, with the same sign as the gradient everywhere
    found = gp.why_no_grad((shifted * X).sum(), shifted)
    assert found.reason is Reason.NON_LEAF and "computed from a .grad" not in found.sentence
    assert "retain_grad()" in found.sentence.split(": ", 1)[1][:60]


def test_the_second_manual_step_fails_and_diagnose_step_says_why(capsys):
    w = leaf()
    expected = pytest.warns(UserWarning, match="not a leaf Tensor is being accessed")
    with pytest.raises(TypeError, match="unsupported operand"), expected:
        for _ in range(2):  # the loop a reader writes; the second pass raises
            with gp.diagnose_step(tensors={"w": w}):
                loss = ((w * X).sum() - 1).pow(2)
                loss.backward()
                w = w - 0.1 * w.grad
    printed = " ".join(capsys.readouterr().out.split())
    assert "'NoneType'. What it means: a .grad was None" in printed
    assert "w: not a leaf: .grad is not kept (NON_LEAF)" in printed
    assert "with torch.no_grad(): w -= lr * w.grad" in printed


# --- Numbers taken out of tensors and put back with torch.tensor([...]): a round trip.

ROUND_TRIPS = {
    "item() into a matrix": "torch.tensor([[torch.cos(t).item(), -torch.sin(t).item()]])",
    "math on a tensor": "torch.tensor([[math.cos(t), -math.sin(t)]])",
    "with requires_grad=True": "torch.tensor([[math.cos(t), math.sin(t)]], requires_grad=True)",
    "NumPy": "torch.tensor(np.stack([np.cos(t.detach().numpy()), np.sin(t.detach().numpy())]))",
}


@pytest.mark.parametrize("make", ROUND_TRIPS.values(), ids=list(ROUND_TRIPS))
def test_numbers_put_back_with_torch_tensor_are_a_round_trip_fixed_by_stack(make):
    import math

    t, scale = torch.tensor(0.3, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    with gp.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Converting a tensor with requires_grad=True"
        rotation = eval(make, {"torch": torch, "math": math, "np": np, "t": t})
        loss = (rotation * scale).sum()
    loss.backward()
    assert t.grad is None and scale.grad is not None  # what PyTorch does
    found = gp.why_no_grad(loss, t, recording=rec)
    assert found.reason is Reason.LEFT_TORCH, found
    assert "came back as a new tensor" in found.sentence, found
    assert "then torch.tensor()" in found.sentence, found
    assert "torch.stack(list)" in found.sentence and "torch.cos(t)" in found.sentence
    assert "only logged" not in found.sentence  # the round trip settles which reading


def test_a_round_trip_names_the_readers_lines():
    import math

    t = torch.tensor(0.3, requires_grad=True)
    with gp.record() as rec:
        rotation = torch.tensor([[math.cos(t), -math.sin(t)]])
        loss = (rotation * 2).sum()
    found = gp.why_no_grad(loss, t, recording=rec)
    assert "float() in `math.cos(t)`, line" in found.sentence, found
    assert "then torch.tensor() in `torch.tensor([[math.cos(t), -math.sin(t)]])`" in found.sentence


# --- A gradient of a gradient: torch.autograd.grad without create_graph=True.


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("alone", [True, False], ids=["penalty alone", "penalty added"])
def test_a_gradient_penalty_needs_create_graph(create_graph, alone):
    torch.manual_seed(0)
    critic, x = nn.Linear(3, 1), torch.randn(4, 3, requires_grad=True)
    with gp.record() as rec:
        out = critic(x).sum()
        (g,) = torch.autograd.grad(out, x, create_graph=create_graph, retain_graph=True)
        penalty = (g.norm(dim=1) - 1).pow(2).mean()
        loss = penalty if alone else out + penalty
    found = gp.why_no_grad(loss, critic.weight, recording=rec)
    if create_graph:  # what PyTorch does: the penalty's gradient reaches the weight
        assert found.reason is Reason.OK or found.reason is Reason.NOT_YET, found
        return
    if alone:
        with pytest.raises(RuntimeError, match="does not require grad"):
            loss.backward()
        assert found.reason is Reason.NOT_DIFFERENTIABLE, found
    else:
        assert found.reason is Reason.PARTIAL, found
    assert "torch.autograd.grad() without create_graph=True" in found.sentence, found
    assert "pass create_graph=True to torch.autograd.grad" in found.sentence
