"""Unit tests of gradstop.simsiam_toy, chapter 6's SimSiam experiment."""

import pytest
import torch

from gradstop import simsiam_toy as toy

SHORT = dict(epochs=2, eval_every=1)


def same_result(a, b):
    """Bit-for-bit equality of two run results."""
    assert a["config"] == b["config"]
    assert a["history"] == b["history"]
    for key in ("loss", "spread", "knn_augmented", "knn_clean", "directions"):
        assert a["final"][key] == b["final"][key], key
    assert torch.equal(a["final"]["singular"], b["final"]["singular"])
    assert a["state"].keys() == b["state"].keys()
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])


def test_parallel_runs_equal_serial_runs_bit_for_bit():
    configs = [
        toy.Config(init_seed=3, view_seed=4, **SHORT),
        toy.Config(init_seed=3, view_seed=4, stop_gradient=False, **SHORT),
        toy.Config(init_seed=5, view_seed=6, predictor=False, **SHORT),
    ]
    try:
        parallel = toy.run_many(configs, workers=2)
        again = toy.run_many(configs[:2], workers=2)  # the same workers, reused
    finally:
        toy.close_pool()
    serial = toy.run_many(configs, workers=1)
    for a, b in zip(again, serial, strict=False):
        same_result(a, b)
    for a, b in zip(parallel, serial, strict=True):
        same_result(a, b)


def test_a_run_depends_on_its_seeds_only():
    first = toy.run(toy.Config(init_seed=1, view_seed=2, **SHORT))
    torch.manual_seed(123)  # the global generator must not matter
    again = toy.run(toy.Config(init_seed=1, view_seed=2, **SHORT))
    same_result(first, again)
    other_views = toy.run(toy.Config(init_seed=1, view_seed=3, **SHORT))
    assert other_views["history"]["epoch_loss"] != first["history"]["epoch_loss"]


def test_run_leaves_the_callers_thread_count_and_generator_alone():
    threads = torch.get_num_threads()
    state = torch.get_rng_state()
    toy.run(toy.Config(epochs=1))
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.get_rng_state(), state)


def test_with_or_without_predictor_the_encoder_starts_the_same():
    torch.manual_seed(0)
    with_predictor = toy.SimSiam(predictor=True)
    torch.manual_seed(0)
    without = toy.SimSiam(predictor=False)
    for part in ("encoder", "projector"):
        a, b = getattr(with_predictor, part).state_dict(), getattr(without, part).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(8, 64)
    z, p = without(x)
    assert p is z


def two_views(n=32):
    d = toy.data()
    gen = torch.Generator().manual_seed(0)
    batch = d.images[d.train_idx[:n]]
    return toy.augment(batch, gen), toy.augment(batch, gen)


def gradients(model, x1, x2, stop_gradient):
    loss = toy.simsiam_loss(model, x1, x2, stop_gradient)
    return loss, torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)


def test_stop_gradient_changes_the_gradient_not_the_loss():
    torch.manual_seed(0)
    model, (x1, x2) = toy.SimSiam(), two_views()
    loss_sg, grads_sg = gradients(model, x1, x2, True)
    loss_plain, grads_plain = gradients(model, x1, x2, False)
    assert loss_sg.item() == loss_plain.item()
    assert not all(torch.allclose(a, b) for a, b in zip(grads_sg, grads_plain, strict=True))


def test_without_predictor_stop_gradient_halves_the_gradient():
    torch.manual_seed(0)
    model, (x1, x2) = toy.SimSiam(predictor=False), two_views()
    _, grads_sg = gradients(model, x1, x2, True)
    _, grads_plain = gradients(model, x1, x2, False)
    # equal up to float rounding, on the scale of the largest gradient entry
    scale = max(b.abs().max().item() for b in grads_plain)
    for a, b in zip(grads_sg, grads_plain, strict=True):
        torch.testing.assert_close(a, b / 2, rtol=1e-4, atol=1e-6 * scale)


def test_directions_holding():
    assert toy.directions_holding(torch.tensor([5.0, 0.0, 0.0])) == 1
    assert toy.directions_holding(torch.tensor([1.0, 1.0, 1.0, 1.0])) == 4
    assert toy.directions_holding(torch.tensor([3.0, 1.0])) == 1  # 9 of 10 is 90 %
    assert toy.directions_holding(torch.tensor([3.0, 1.0]), share=0.95) == 2


def test_data_is_the_digits_split_1297_500():
    d = toy.data()
    assert d.images.shape == (1797, 8, 8) and len(d.train_idx) == 1297
    assert sorted(torch.cat([d.train_idx, d.test_idx]).tolist()) == list(range(1797))
    assert d.queries.shape == (3 * 500, 64)


def test_summary_table_reports_mean_std_min_max():
    runs = [
        {"final": {"loss": v, "spread": v, "knn_augmented": v, "knn_clean": v, "directions": 1}}
        for v in (0.1, 0.3)
    ]
    runs = [{**r, "initial": {"knn_augmented": 0.5, "knn_clean": 0.9}} for r in runs]
    table = toy.summary_table({"demo": runs}, untrained=runs)
    assert "| demo | 2 | 0.200 ± 0.141 [0.100, 0.300] |" in table
    assert "| untrained encoder | 2 | – | – | 0.500 ± 0.000 [0.500, 0.500] |" in table


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: toy.Config(epochs=0), "epochs and eval_every must be at least 1"),
        (lambda: toy.Config(batch=1), "batch must be between 2 and 1297"),
        (lambda: toy.run_many([], workers=0), "workers must be at least 1"),
        (lambda: toy.augment(torch.zeros(2, 64), torch.Generator()), "expects shape (n, 8, 8)"),
        (lambda: toy.directions_holding(torch.ones(3), share=1.5), "share must be in"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_sgd_step_is_torch_sgd_with_momentum_and_weight_decay():
    torch.manual_seed(0)
    ours = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    velocity = [torch.zeros_like(p) for p in ours]
    optimizer = torch.optim.SGD(
        theirs, lr=0.5, momentum=toy.MOMENTUM, weight_decay=toy.WEIGHT_DECAY
    )
    for step in range(5):
        for params in (ours, theirs):
            for p in params:
                p.grad = None
            ((params[0] @ params[1]).sin().sum() * (step + 1)).backward()
        toy.sgd_step(ours, velocity, lr=0.5)
        optimizer.step()
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
