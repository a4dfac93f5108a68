"""SimSiam on scikit-learn's handwritten digits: chapter 6's seeded experiment.

One training run is a pure function of its :class:`Config`: the weights come from
``init_seed``, every augmented view from ``view_seed``, and nothing else is random.

Runs that share a schedule train together as one *stack*: every model's weights
stacked along a new first dimension, so that each layer is one batched matrix
product (``torch.baddbmm``) for all the models instead of one small product per
model. Batching changes no number: a model trained in a stack gets, bit for bit,
what it gets trained alone (``tests/test_gradstop_simsiam.py`` checks it), so
:func:`run_many` may split the runs across worker processes as it likes.

``augment(batch, gen)``
    the augmentations: small rotation, zoom and shift; brightness; a 3 x 3 patch
    erased in half of the images; a little noise.
``SimSiam(predictor=True)``
    encoder, projector ending in BatchNorm, bottleneck predictor (or none): the
    model as a reader writes it; the stack computes exactly this model.
``simsiam_loss(model, x1, x2, stop_gradient)``
    the paper's symmetric negative cosine similarity, with or without ``detach()``.
``Config``, ``run(config)``, ``run_many(configs, workers)``, ``Training``
    train and measure: loss, directions used, spread of the output, kNN accuracy;
    ``Training`` trains many runs in worker processes, part of the way at a time.
``summary_table(groups)``
    mean, standard deviation, minimum and maximum of each final figure.
"""

from __future__ import annotations

import math
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "D",
    "Config",
    "Data",
    "SimSiam",
    "Training",
    "augment",
    "close_pool",
    "data",
    "directions",
    "directions_holding",
    "negative_cosine",
    "rebuild",
    "run",
    "run_many",
    "simsiam_loss",
    "source",
    "spread",
    "summary_table",
]

D = 64  # output channels of the projector (the paper's d)
FIGURES = {  # the final figures a run reports, in table order
    "directions": "directions holding 90%",
    "spread": "std·√d",
    "loss": "final loss",
    "knn_augmented": "kNN, augmented queries",
    "knn_clean": "kNN, clean queries",
}


@dataclass(frozen=True)
class Data:
    images: torch.Tensor  # (1797, 8, 8), values in [0, 1]
    labels: torch.Tensor
    train_idx: torch.Tensor  # 1297 images to train on and to search in (kNN bank)
    test_idx: torch.Tensor  # 500 held-out images, the kNN queries
    queries: torch.Tensor  # three augmented copies of each held-out image, flattened


_DATA: Data | None = None


def data() -> Data:
    """The digits, split and with their augmented queries; the same in every process."""
    global _DATA
    if _DATA is None:
        from sklearn.datasets import load_digits  # ships with scikit-learn: no download

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
        split = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
        test_idx = split[1297:]
        query_gen = torch.Generator().manual_seed(2)
        queries = torch.cat([augment(images[test_idx], query_gen) for _ in range(3)])
        _DATA = Data(images, torch.tensor(digits.target), split[:1297], test_idx, queries)
    return _DATA


def affine(batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Rotate up to 15 degrees, zoom up to 10 %, shift up to one pixel."""
    n = len(batch)
    angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(15)
    zoom = 1 + (torch.rand(n, generator=gen) * 2 - 1) * 0.1
    # grid coordinates run from -1 to 1 over 8 pixels: 1/4 is one pixel
    shift = (torch.rand(n, 2, generator=gen) * 2 - 1) / 4
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack(
        [
            torch.stack([cos, -sin, shift[:, 0]], 1),
            torch.stack([sin, cos, shift[:, 1]], 1),
        ],
        1,
    )
    grid = F.affine_grid(theta, [n, 1, 8, 8], align_corners=False)
    return F.grid_sample(batch[:, None], grid, align_corners=False)[:, 0]


def augment(batch: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One random view of each 8 x 8 image in ``batch``, flattened."""
    if batch.dim() != 3 or batch.shape[1:] != (8, 8):
        shape = tuple(batch.shape)
        raise ValueError(f"augment expects shape (n, 8, 8), got {shape}")
    out = affine(batch, gen)
    out = out * (0.8 + 0.4 * torch.rand(len(out), 1, 1, generator=gen))
    top, left = torch.randint(0, 6, (2, len(out), 1, 1), generator=gen)
    rows, cols = torch.arange(8)[:, None], torch.arange(8)[None, :]
    in_rows = (rows >= top) & (rows < top + 3)
    patch = in_rows & (cols >= left) & (cols < left + 3)
    erase = torch.rand(len(out), 1, 1, generator=gen) < 0.5
    out = out.masked_fill(patch & erase, 0.0)
    return (out + 0.05 * torch.randn(out.shape, generator=gen)).flatten(1)


# ---------------------------------------------------------------------------
# The model, as a reader writes it


def block(n_in: int, n_out: int) -> list[nn.Module]:
    return [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), nn.ReLU()]


class SimSiam(nn.Module):
    """A small SimSiam: encoder, projector (ending in BatchNorm), predictor.

    The predictor is built last, so with or without it the encoder and projector
    start from the same weights for the same seed. ``predictor=False`` makes it
    the identity: then ``p`` is ``z``.
    """

    def __init__(self, predictor: bool = True):
        super().__init__()
        self.encoder = nn.Sequential(*block(64, 128), *block(128, 64))
        self.projector = nn.Sequential(*block(64, 64), nn.Linear(64, D))
        self.projector.append(nn.BatchNorm1d(D))  # ends in BatchNorm, no ReLU
        self.predictor = None
        if predictor:
            self.predictor = nn.Sequential(*block(D, 16), nn.Linear(16, D))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.projector(self.encoder(x))
        return z, (self.predictor(z) if self.predictor is not None else z)


def negative_cosine(p, z, stop_gradient: bool) -> torch.Tensor:
    if stop_gradient:
        z = z.detach()
    return -F.cosine_similarity(p, z, dim=1).mean()


def simsiam_loss(model, x1, x2, stop_gradient: bool) -> torch.Tensor:
    """The paper's symmetric loss: p1 against z2, p2 against z1."""
    z1, p1 = model(x1)
    z2, p2 = model(x2)
    first = negative_cosine(p1, z2, stop_gradient)
    second = negative_cosine(p2, z1, stop_gradient)
    return first / 2 + second / 2


def directions_holding(singular: torch.Tensor, share: float = 0.9) -> int:
    """How many singular directions hold ``share`` of the sum of squares."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    energy = (singular**2).cumsum(0) / (singular**2).sum()
    return int((energy < share - 1e-9).sum()) + 1


def directions(outputs: torch.Tensor, share: float = 0.9) -> int:
    """How many directions hold ``share`` of the l2-normalised rows of ``outputs``."""
    return directions_holding(torch.linalg.svdvals(F.normalize(outputs, dim=1)), share)


def spread(outputs: torch.Tensor) -> float:
    """std·√d: the standard deviation of each channel of the l2-normalised rows of
    ``outputs`` (n, d), averaged over the channels, times √d (the paper's measure,
    scaled so that an isotropic Gaussian gives about 1)."""
    unit = F.normalize(outputs, dim=1)
    return unit.std(dim=0).mean().item() * math.sqrt(outputs.shape[1])


# ---------------------------------------------------------------------------
# One run's settings


@dataclass(frozen=True)
class Config:
    """One training run. Everything random in it comes from the two seeds."""

    stop_gradient: bool = True
    predictor: bool = True
    init_seed: int = 0
    view_seed: int = 1
    epochs: int = 30
    batch: int = 128
    lr: float = 0.4
    decay: str = "none"  # or "cosine": lr · ½(1 + cos(π (epoch - 1) / epochs))
    momentum: float = 0.9
    weight_decay: float = 1e-3
    eval_every: int = 5
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if self.epochs < 1 or self.eval_every < 1:
            raise ValueError(f"epochs and eval_every must be at least 1, got {self}")
        if not 2 <= self.batch <= 1297:
            raise ValueError(f"batch must be between 2 and 1297 (BatchNorm needs 2), got {self}")
        if self.decay not in ("none", "cosine"):
            raise ValueError(f"decay must be 'none' or 'cosine', got {self.decay!r}")

    def lr_at(self, epoch: int) -> float:
        """The learning rate of the steps of ``epoch`` (1, 2, ..., epochs)."""
        if self.decay == "none":
            return self.lr
        return self.lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / self.epochs))

    def shared(self) -> tuple:
        """What runs trained in one stack must share; the schedule may differ."""
        return (self.batch, self.momentum, self.weight_decay)


@torch.no_grad()
def sgd_step(params, velocity, lr, momentum, weight_decay) -> None:
    """One step of SGD with momentum and weight decay, as torch.optim.SGD
    takes it. ``lr`` is a number, or a tensor of one rate per stacked model.

    Written out: creating a torch.optim optimizer imports TorchDynamo the
    first time, which costs each fresh worker process seconds.
    """
    for p, v in zip(params, velocity, strict=True):
        if p.grad is None:
            continue
        v.mul_(momentum).add_(p.grad + weight_decay * p)
        if isinstance(lr, torch.Tensor):  # along the stack's first dimension
            p.sub_(lr.view(-1, *[1] * (p.dim() - 1)) * v)
        else:
            p.sub_(lr * v)


# ---------------------------------------------------------------------------
# A stack of models: the weights of model s are params[name][s]


@dataclass
class Stack:
    """Models of one shape, trained together. ``template`` is one of them, for its
    layers' kinds; ``views`` says which view stream (seed) feeds each model."""

    configs: list[Config]
    template: SimSiam
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    velocity: list[torch.Tensor]
    views: torch.Tensor
    stop_gradient: torch.Tensor
    predictor: torch.Tensor

    def keep(self, which: list[int]) -> Stack:
        """The stack of models ``which`` only, each as it is now."""
        index = torch.tensor(which, dtype=torch.long)
        params = {k: v.detach()[index].requires_grad_() for k, v in self.params.items()}
        buffers = {k: v[index] for k, v in self.buffers.items()}
        velocity = [v[index] for v in self.velocity]
        flags = (self.views[index], self.stop_gradient[index], self.predictor[index])
        chosen = [self.configs[i] for i in which]
        return Stack(chosen, self.template, params, buffers, velocity, *flags)


def stack(configs: list[Config]) -> Stack:
    """The untrained models of ``configs``, stacked; each from its own ``init_seed``.

    ``views`` indexes the view seeds of the configs, sorted: the order in which
    :func:`train_epoch` expects its generators."""
    from torch.func import stack_module_state

    models = []
    for config in configs:
        # the CPU generator alone: torch.manual_seed also seeds CUDA, lazily and slowly
        torch.random.default_generator.manual_seed(config.init_seed)
        models.append(SimSiam(predictor=True))  # unused when config.predictor is False
    params, buffers = stack_module_state(models)
    params = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    seeds = sorted({c.view_seed for c in configs})
    flags = {
        k: torch.tensor([getattr(c, k) for c in configs]) for k in ("stop_gradient", "predictor")
    }
    return Stack(
        list(configs),
        models[0],
        params,
        buffers,
        [torch.zeros_like(p) for p in params.values()],
        torch.tensor([seeds.index(c.view_seed) for c in configs]),
        **flags,
    )


def _batchnorm(s: Stack, key: str, h: torch.Tensor, views: int, training: bool):
    """BatchNorm of every model at once; ``h`` is (models, channels, views · n).

    Each view is normalised with its own batch statistics, as the model called once
    per view does, and the running statistics are updated once per view, in order.
    """
    models, channels, columns = h.shape
    weight, bias = s.params[key + "weight"], s.params[key + "bias"]
    mean, var = s.buffers[key + "running_mean"], s.buffers[key + "running_var"]
    if not training:
        flat = h.reshape(1, models * channels, columns)
        out = F.batch_norm(flat, mean.flatten(), var.flatten(), weight.flatten(), bias.flatten())
        return out.view_as(h)
    per_view = h.reshape(1, models * channels * views, columns // views)
    weight, bias = (t[:, :, None].expand(-1, -1, views).reshape(-1) for t in (weight, bias))
    # momentum=1 leaves in batch_mean, batch_var exactly this batch's statistics
    batch_mean, batch_var = (torch.zeros(per_view.shape[1]) for _ in range(2))
    out = F.batch_norm(per_view, batch_mean, batch_var, weight, bias, True, momentum=1.0)
    with torch.no_grad():
        for v in range(views):
            mean.mul_(0.9).add_(0.1 * batch_mean.view(models, channels, views)[:, :, v])
            var.mul_(0.9).add_(0.1 * batch_var.view(models, channels, views)[:, :, v])
        s.buffers[key + "num_batches_tracked"] += views
    return out.view_as(h)


def _sequential(s: Stack, part: str, h: torch.Tensor, views: int, training: bool):
    """Run the stack's ``part`` ("encoder", ...) over ``h``, (models, features, n)."""
    for i, layer in enumerate(getattr(s.template, part)):
        key = f"{part}.{i}."
        if isinstance(layer, nn.Linear):
            weight, bias = s.params[key + "weight"], s.params[key + "bias"]
            h = torch.baddbmm(bias[:, :, None], weight, h)
        elif isinstance(layer, nn.BatchNorm1d):
            h = _batchnorm(s, key, h, views, training)
        else:
            h = torch.relu(h)
    return h


def stacked_loss(s: Stack, x: torch.Tensor) -> torch.Tensor:
    """Each model's symmetric loss on its two views; ``x`` is (models, 64, 2 · n),
    the first view's n images, then the second's."""
    z = _sequential(s, "projector", _sequential(s, "encoder", x, 2, True), 2, True)
    p = _sequential(s, "predictor", z, 2, True)
    p = torch.where(s.predictor[:, None, None], p, z)  # no predictor: p is z
    target = torch.where(s.stop_gradient[:, None, None], z.detach(), z)
    n = x.shape[-1] // 2
    first = -F.cosine_similarity(p[..., :n], target[..., n:], dim=1).mean(-1)
    second = -F.cosine_similarity(p[..., n:], target[..., :n], dim=1).mean(-1)
    return first / 2 + second / 2


# ---------------------------------------------------------------------------
# Measuring a stack


def _features(s: Stack, images: torch.Tensor) -> torch.Tensor:
    """The encoder's features of flattened ``images`` (n, 64), for every model, in
    eval mode: (models, 128, n)."""
    x = images.T[None].expand(len(s.configs), -1, -1)
    return _sequential(s, "encoder", x, 1, False)


def _knn(s: Stack, bank: torch.Tensor, queries: torch.Tensor, k: int = 5) -> list[float]:
    """kNN accuracy (cosine, k votes) of each model's encoder: ``queries`` are copies of
    the held-out digits in order, searched among the clean training images."""
    d = data()
    found = torch.bmm(F.normalize(_features(s, queries), dim=1).transpose(1, 2), bank)
    votes = d.labels[d.train_idx][found.topk(k, dim=2).indices]
    truth = d.labels[d.test_idx].repeat(len(queries) // len(d.test_idx))
    return (votes.mode(dim=2).values == truth).float().mean(1).tolist()


@torch.no_grad()
def evaluate(s: Stack, knn: bool = True) -> list[dict]:
    """Each model's figures, in eval mode (BatchNorm: running statistics): the
    projector's output on the held-out digits (its singular values, the directions
    holding 90 % of it, its spread) and, with ``knn``, the encoder's kNN accuracy
    and the directions holding 90 % of its own (normalised) features."""
    d = data()
    held_out = d.images[d.test_idx].flatten(1)
    features = _features(s, held_out)
    z = _sequential(s, "projector", features, 1, False).transpose(1, 2)
    singular = torch.linalg.svdvals(F.normalize(z, dim=2))
    figures = [
        {"spread": spread(z[i]), "directions": directions_holding(v), "singular": v}
        for i, v in enumerate(singular)
    ]
    if knn:
        bank = F.normalize(_features(s, d.images[d.train_idx].flatten(1)), dim=1)
        scores = zip(_knn(s, bank, d.queries), _knn(s, bank, held_out), strict=True)
        below = torch.linalg.svdvals(F.normalize(features, dim=1).transpose(1, 2))
        for f, (augmented, clean), v in zip(figures, scores, below, strict=True):
            f.update(knn_augmented=augmented, knn_clean=clean)
            f["encoder_directions"] = directions_holding(v)  # of its features, below z
    return figures


# ---------------------------------------------------------------------------
# Training a stack


class _Threads:
    """Run with one intra-op thread (the same numbers on every run), then restore."""

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def _epoch_views(s: Stack, generators: list[torch.Generator]) -> list[tuple]:
    """One epoch's two views of the training images, per view stream, in a fresh order."""
    images = data().images[data().train_idx]
    views = []
    for gen in generators:
        batch = images[torch.randperm(len(images), generator=gen)]
        views.append((augment(batch, gen), augment(batch, gen)))
    return views


def train_epoch(s: Stack, generators: list[torch.Generator], epoch: int) -> list[float]:
    """One pass over the training images for every model, each at its own learning
    rate for ``epoch``; each model's mean loss."""
    config, params = s.configs[0], list(s.params.values())
    lr = torch.tensor([c.lr_at(epoch) for c in s.configs])
    streams, losses = _epoch_views(s, generators), []
    size = config.batch
    for i in range(0, len(streams[0][0]) - size + 1, size):
        pairs = [torch.cat([v1[i : i + size], v2[i : i + size]]).T for v1, v2 in streams]
        loss = stacked_loss(s, torch.stack(pairs)[s.views])
        for p in params:
            p.grad = None
        loss.sum().backward()  # model s's weights get the gradient of loss[s] alone
        sgd_step(params, s.velocity, lr, config.momentum, config.weight_decay)
        losses.append(loss.tolist())
    return [sum(column) / len(column) for column in zip(*losses, strict=True)]


def _record(history: dict, epoch: int, figures: dict) -> None:
    history["eval_epoch"].append(epoch)
    for key in ("spread", "directions"):
        history[key].append(figures[key])


HISTORY = ("eval_epoch", "spread", "directions")


@dataclass
class Part:
    """Runs trained as one stack, part of the way: everything a later part needs to
    carry on exactly where this one stopped (weights, velocities, BatchNorm's running
    statistics, the view generators' states, the history so far)."""

    configs: list[Config]
    epoch: int = 0  # the last epoch trained
    stack: Stack | None = None  # the models still training
    alive: list[int] = field(default_factory=list)  # the config index of each of them
    initial: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    results: list = field(default_factory=list)
    generator_states: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self):
        if len({c.shared() for c in self.configs}) != 1:
            raise ValueError("runs trained in one stack must share batch, momentum, weight_decay")

    @property
    def epochs(self) -> int:
        return max(c.epochs for c in self.configs)


def _begin(part: Part) -> list[torch.Generator]:
    """The untrained stack of a part, measured; its view generators, freshly seeded."""
    part.stack = stack(part.configs)
    part.alive = list(range(len(part.configs)))
    part.initial = evaluate(part.stack)
    part.history = [{"epoch_loss": [], **{k: [] for k in HISTORY}} for _ in part.configs]
    for h, figures in zip(part.history, part.initial, strict=True):
        _record(h, 0, figures)
    part.results = [None] * len(part.configs)
    seeds = sorted({c.view_seed for c in part.configs})
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def advance(part: Part, to_epoch: int) -> Part:
    """Train ``part`` on to ``to_epoch`` (or its last epoch), each model for its own
    schedule; a model leaves the stack after its last epoch, with its result."""
    with _Threads(), torch.random.fork_rng(devices=[]):
        if part.stack is None and part.epoch == 0:
            generators = _begin(part)
        else:
            generators = [torch.Generator() for _ in part.generator_states]
            for g, state in zip(generators, part.generator_states, strict=True):
                g.set_state(state)
        for epoch in range(part.epoch + 1, min(to_epoch, part.epochs) + 1):
            _one_epoch(part, generators, epoch)
            part.epoch = epoch
        part.generator_states = [g.get_state() for g in generators]
    return part


def _one_epoch(part: Part, generators: list[torch.Generator], epoch: int) -> None:
    s, history = part.stack, part.history
    for i, loss in zip(part.alive, train_epoch(s, generators, epoch), strict=True):
        history[i]["epoch_loss"].append(loss)
    done = [j for j, c in enumerate(s.configs) if epoch == c.epochs]
    for j, figures in zip(done, evaluate(s.keep(done)) if done else [], strict=True):
        i = part.alive[j]
        _record(history[i], epoch, figures)
        final = {**figures, "loss": history[i]["epoch_loss"][-1]}
        part.results[i] = _result(s, j, part.initial[i], final, history[i])
    _evaluate_due(s, part.alive, history, epoch)
    part.stack, part.alive = _without(s, part.alive, done)


def run_stack(configs: list[Config]) -> list[dict]:
    """Train the models of ``configs`` together, in this process; one result each."""
    part = Part(list(configs))
    return advance(part, part.epochs).results


def _evaluate_due(s: Stack, alive: list[int], history: list[dict], epoch: int) -> None:
    """Record the cheap figures of the models (not finished) due an evaluation."""
    due = [j for j, c in enumerate(s.configs) if epoch % c.eval_every == 0 and epoch < c.epochs]
    if due:
        for j, figures in zip(due, evaluate(s.keep(due), knn=False), strict=True):
            _record(history[alive[j]], epoch, figures)


def _without(s: Stack, alive: list[int], done: list[int]):
    """The stack and its config indices without the models ``done``; None when empty."""
    if not done:
        return s, alive
    rest = [j for j in range(len(s.configs)) if j not in done]
    return (s.keep(rest) if rest else None), [alive[j] for j in rest]


def _result(s: Stack, i: int, initial: dict, final: dict, history: dict) -> dict:
    """Model i of the stack as one run's result, its weights as a SimSiam state_dict."""
    state = {k: v[i].detach().clone() for k, v in {**s.params, **s.buffers}.items()}
    if not s.configs[i].predictor:
        state = {k: v for k, v in state.items() if not k.startswith("predictor.")}
    return {
        "config": s.configs[i],
        "initial": initial,
        "final": final,
        "history": history,
        "state": state,
    }


def run(config: Config) -> dict:
    """Train one SimSiam on the digits and measure it; deterministic in ``config``.

    Returns the config, the untrained model's figures (``initial``), the final
    figures (``final``: its ``loss`` is the mean over the last epoch), the history
    (mean loss per epoch; spread, directions and kNN every ``eval_every`` epochs and
    at the end) and the final ``state`` (the trained weights, as a state_dict).
    """
    return run_stack([config])[0]


# ---------------------------------------------------------------------------
# Many runs, in worker processes


# Between processes everything travels as bytes of the standard pickle, which copies a
# tensor's numbers. Sent as objects, tensors would go through torch.multiprocessing's
# sharing, one open file descriptor per storage: a few thousand for one call of
# Training.advance, past the usual limit of 1024 open files (`ulimit -n`), at which
# a worker dies and the pool breaks.


def _start_worker(shared: bytes) -> None:
    """In a fresh worker: one thread, and the parent's data (no second loading)."""
    global _DATA
    torch.set_num_threads(1)
    _DATA = pickle.loads(shared)


def _advance_pickled(part: bytes, to_epoch: int) -> bytes:
    """:func:`advance` in a worker, from and to pickled bytes."""
    return pickle.dumps(advance(pickle.loads(part), to_epoch))


_POOL: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    """The worker pool, started once and kept for later calls (close_pool ends it)."""
    if workers not in _POOL:
        close_pool()
        context = multiprocessing.get_context("spawn")
        _POOL[workers] = ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(pickle.dumps(data()),),
        )
    return _POOL[workers]


def close_pool() -> None:
    """Stop the worker processes of :func:`run_many`, if any are running."""
    for pool in _POOL.values():
        pool.shutdown()
    _POOL.clear()


def _chunks(configs: list[Config], workers: int) -> list[list[int]]:
    """Indices of ``configs`` in stacks, at most ``workers`` per group of runs that
    can share a stack, of about equal work (epochs), the longest runs shared out
    first."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(c.shared(), []).append(i)
    chunks = []
    for ids in groups.values():
        parts, work = [[] for _ in range(min(workers, len(ids)))], [0] * workers
        for i in sorted(ids, key=lambda i: -configs[i].epochs):
            lightest = work.index(min(work[: len(parts)]))
            parts[lightest].append(i)
            work[lightest] += configs[i].epochs
        chunks += [sorted(part) for part in parts]
    return chunks


class Training:
    """Many runs in worker processes, as stacks, trained part of the way at a time.

    ``Training(configs)`` shares the runs out into one stack per worker (runs that
    can share a stack, of about equal work); ``advance(to_epoch)`` trains every
    stack on to that epoch, in the workers, and brings its state back; ``results()``
    gives one result per config, in order, once every run has finished. Training in
    parts changes no number: a run's result is, bit for bit, what ``run`` gives.
    Workers are started with "spawn" (fresh interpreters that import this module,
    never forked from a Jupyter kernel), once: later calls reuse them until
    :func:`close_pool`.
    """

    def __init__(self, configs: list[Config], workers: int = 2):
        self.configs = list(configs)
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self.chunks = _chunks(self.configs, workers)
        self.parts = [Part([self.configs[i] for i in chunk]) for chunk in self.chunks]

    def advance(self, to_epoch: int) -> None:
        """Train every run on to ``to_epoch`` (or its last epoch)."""
        jobs = [(part, to_epoch) for part in self.parts]
        if self.workers == 1 or len(self.parts) < 2:
            self.parts = [advance(*job) for job in jobs]
        else:
            sent = [pickle.dumps(part) for part in self.parts]
            done = _pool(self.workers).map(_advance_pickled, sent, [to_epoch] * len(sent))
            self.parts = [pickle.loads(part) for part in done]

    def results(self) -> list[dict]:
        unfinished = [p.epoch for p in self.parts if p.epoch < p.epochs]
        if unfinished:
            raise ValueError(f"not trained to the end yet: a stack is at epoch {unfinished[0]}")
        results = [None] * len(self.configs)
        for chunk, part in zip(self.chunks, self.parts, strict=True):
            for i, result in zip(chunk, part.results, strict=True):
                results[i] = result
        return results


def run_many(configs: list[Config], workers: int = 2) -> list[dict]:
    """``run`` over ``configs``, in order, as stacks in ``workers`` worker processes."""
    training = Training(configs, workers)
    training.advance(max((c.epochs for c in training.configs), default=0))
    return training.results()


def rebuild(result: dict) -> SimSiam:
    """The trained model of a ``run`` result, in training mode."""
    model = SimSiam(predictor=result["config"].predictor)
    model.load_state_dict(result["state"])
    return model


# ---------------------------------------------------------------------------
# Reporting


def stats(values: list[float]) -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    std = t.std().item() if len(values) > 1 else 0.0
    return {"mean": t.mean().item(), "std": std, "min": t.min().item(), "max": t.max().item()}


def _cell(values: list[float], key: str) -> str:
    s = stats(values)
    digits = 1 if key == "directions" else 3
    return (
        f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} "
        f"[{s['min']:.{digits}f}, {s['max']:.{digits}f}]"
    )


def summary_table(
    groups: dict[str, list[dict]], untrained: list[dict] | None = None, keys=None
) -> str:
    """A Markdown table: for each group of runs and each final figure (``keys`` of
    FIGURES, all by default), mean ± std (sample standard deviation over the runs)
    and [min, max]. With ``untrained``, a last row gives those runs' untrained
    encoders' kNN figures."""
    keys = list(FIGURES) if keys is None else list(keys)
    unknown = [k for k in keys if k not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figures {unknown}; choose from {list(FIGURES)}")
    header = "| runs | n | " + " | ".join(FIGURES[k] for k in keys) + " |"
    lines = [header, "|" + "---|" * (len(keys) + 2)]
    rows = [(name, [r["final"] for r in results]) for name, results in groups.items()]
    if untrained:
        knn_only = [{k: r["initial"][k] for k in ("knn_augmented", "knn_clean")} for r in untrained]
        rows.append(("untrained encoder", knn_only))
    for name, finals in rows:
        cells = [_cell([f[k] for f in finals], k) if k in finals[0] else "–" for k in keys]
        lines.append(f"| {name} | {len(finals)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source(*objects):
    """The source code of these functions or classes, for a chapter to show."""
    import inspect

    from IPython.display import Code

    return Code("\n\n".join(inspect.getsource(o) for o in objects), language="python")
