"""SimSiam on scikit-learn's handwritten digits: chapter 6's seeded experiment.

One training run is a pure function of its :class:`Config`: the weights come from
``init_seed``, every augmented view from ``view_seed``, and nothing else is random.
So runs can be sent to worker processes (:func:`run_many`) and give bit for bit
the numbers they give in the notebook's own process.

``augment(batch, gen)``
    the augmentations: small rotation, zoom and shift; brightness; a 3 x 3 patch
    erased in half of the images; a little noise.
``SimSiam(predictor=True)``
    encoder, projector ending in BatchNorm, bottleneck predictor (or none).
``simsiam_loss(model, x1, x2, stop_gradient)``
    the paper's symmetric negative cosine similarity, with or without ``detach()``.
``run(config)`` / ``run_many(configs, workers)``
    train and measure: loss, spread of the output, kNN accuracy, directions used.
``summary_table(results)``
    mean, standard deviation, minimum and maximum of each final figure.
"""

from __future__ import annotations

import math
import multiprocessing
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
    "augment",
    "close_pool",
    "data",
    "directions_holding",
    "evaluate",
    "negative_cosine",
    "run",
    "rebuild",
    "run_many",
    "simsiam_loss",
    "source",
    "summary_table",
]

D = 64  # output channels of the projector (the paper's d)
FIGURES = {  # the final figures a run reports, in table order
    "loss": "final loss",
    "spread": "std·√d",
    "knn_augmented": "kNN, augmented queries",
    "knn_clean": "kNN, clean queries",
    "directions": "directions holding 90%",
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
        self.encoder = nn.Sequential(*block(64, 256), *block(256, 128))
        self.projector = nn.Sequential(*block(128, 128), nn.Linear(128, D))
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


def knn_accuracy(model, queries: torch.Tensor, k: int = 5) -> float:
    """kNN (cosine, k votes) of the encoder's features of ``queries``, against the
    clean training images; ``queries`` are copies of the held-out digits in order."""
    d = data()
    bank = F.normalize(model.encoder(d.images[d.train_idx].flatten(1)), dim=1)
    found = F.normalize(model.encoder(queries), dim=1) @ bank.T
    votes = d.labels[d.train_idx][found.topk(k, dim=1).indices]
    truth = d.labels[d.test_idx].repeat(len(queries) // len(d.test_idx))
    return (votes.mode(dim=1).values == truth).float().mean().item()


def evaluate(model) -> dict:
    """The figures of a model, in eval mode (BatchNorm: running statistics)."""
    d = data()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        z = model.projector(model.encoder(d.images[d.test_idx].flatten(1)))
        unit = F.normalize(z, dim=1)
        singular = torch.linalg.svdvals(unit)
        figures = {
            "spread": unit.std(dim=0).mean().item() * math.sqrt(D),
            "knn_augmented": knn_accuracy(model, d.queries),
            "knn_clean": knn_accuracy(model, d.images[d.test_idx].flatten(1)),
            "directions": directions_holding(singular),
            "singular": singular,
        }
    model.train(was_training)
    return figures


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
    eval_every: int = 5
    name: str = field(default="", compare=False)

    def __post_init__(self):
        if self.epochs < 1 or self.eval_every < 1:
            raise ValueError(f"epochs and eval_every must be at least 1, got {self}")
        if not 2 <= self.batch <= 1297:
            raise ValueError(f"batch must be between 2 and 1297 (BatchNorm needs 2), got {self}")


MOMENTUM, WEIGHT_DECAY = 0.9, 1e-3


@torch.no_grad()
def sgd_step(params: list[torch.Tensor], velocity: list[torch.Tensor], lr: float) -> None:
    """One step of SGD with momentum and weight decay, as ``torch.optim.SGD`` takes it.

    Written out because creating a ``torch.optim`` optimizer imports TorchDynamo the
    first time, which costs each fresh worker process seconds.
    """
    for p, v in zip(params, velocity, strict=True):
        if p.grad is None:
            continue
        v.mul_(MOMENTUM).add_(p.grad + WEIGHT_DECAY * p)
        p.sub_(lr * v)


class _Threads:
    """Run with one intra-op thread (the same numbers on every run), then restore."""

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def train_epoch(model, params, velocity, images, view_gen, config: Config) -> float:
    """One pass over ``images`` in a random order, two fresh views of each batch;
    returns the mean loss of the epoch's steps."""
    order = torch.randperm(len(images), generator=view_gen)
    batch = images[order]
    v1, v2 = augment(batch, view_gen), augment(batch, view_gen)
    losses = []
    for i in range(0, len(v1) - config.batch + 1, config.batch):
        step = slice(i, i + config.batch)
        loss = simsiam_loss(model, v1[step], v2[step], config.stop_gradient)
        for p in params:
            p.grad = None
        loss.backward()
        sgd_step(params, velocity, config.lr)
        losses.append(loss.item())
    return sum(losses) / len(losses)


def run(config: Config) -> dict:
    """Train one SimSiam on the digits and measure it; deterministic in ``config``.

    Returns the config, the untrained model's figures (``initial``), the final
    figures (``final``: its ``loss`` is the mean over the last epoch), the history
    (mean loss per epoch; spread and kNN every ``eval_every`` epochs and at the
    end) and the final ``state`` (the trained weights).
    """
    train_images = data().images[data().train_idx]
    with _Threads(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = SimSiam(predictor=config.predictor)
        initial = evaluate(model)
        params = list(model.parameters())
        velocity = [torch.zeros_like(p) for p in params]
        view_gen = torch.Generator().manual_seed(config.view_seed)
        history = {"epoch_loss": [], "eval_epoch": [0], "spread": [initial["spread"]]}
        history["knn_augmented"] = [initial["knn_augmented"]]
        for epoch in range(1, config.epochs + 1):
            loss = train_epoch(model, params, velocity, train_images, view_gen, config)
            history["epoch_loss"].append(loss)
            if epoch % config.eval_every == 0 or epoch == config.epochs:
                figures = evaluate(model)
                history["eval_epoch"].append(epoch)
                for key in ("spread", "knn_augmented"):
                    history[key].append(figures[key])
        final = {**figures, "loss": history["epoch_loss"][-1]}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return {
        "config": config,
        "initial": initial,
        "final": final,
        "history": history,
        "state": state,
    }


def _start_worker(shared: Data) -> None:
    """In a fresh worker: one thread, and the parent's data (no second loading)."""
    global _DATA
    torch.set_num_threads(1)
    _DATA = shared


_POOL: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    """The worker pool, started once and kept for later calls (close_pool ends it)."""
    if workers not in _POOL:
        close_pool()
        context = multiprocessing.get_context("spawn")
        _POOL[workers] = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_start_worker, initargs=(data(),)
        )
    return _POOL[workers]


def close_pool() -> None:
    """Stop the worker processes of :func:`run_many`, if any are running."""
    for pool in _POOL.values():
        pool.shutdown()
    _POOL.clear()


def run_many(configs: list[Config], workers: int = 2) -> list[dict]:
    """``run`` over ``configs``, in order; in ``workers`` worker processes if more than 1.

    Workers are started with "spawn" (fresh interpreters that import this module, never
    forked from a Jupyter kernel), once: later calls reuse them until :func:`close_pool`.
    """
    configs = list(configs)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1 or len(configs) < 2:
        return [run(c) for c in configs]
    return list(_pool(workers).map(run, configs))


def rebuild(result: dict) -> SimSiam:
    """The trained model of a ``run`` result, in training mode."""
    model = SimSiam(predictor=result["config"].predictor)
    model.load_state_dict(result["state"])
    return model


def stats(values: list[float]) -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    std = t.std().item() if len(values) > 1 else 0.0
    return {"mean": t.mean().item(), "std": std, "min": t.min().item(), "max": t.max().item()}


def summary_table(groups: dict[str, list[dict]], untrained: list[dict] | None = None) -> str:
    """A Markdown table: for each group of runs and each final figure, mean ± std
    (sample standard deviation over the runs) and [min, max]. With ``untrained``,
    a last row gives the kNN accuracies of those runs' untrained encoders."""
    header = "| runs | n | " + " | ".join(FIGURES.values()) + " |"
    lines = [header, "|" + "---|" * (len(FIGURES) + 2)]
    rows = [(name, [r["final"] for r in results]) for name, results in groups.items()]
    if untrained:
        knn_only = [{k: r["initial"][k] for k in ("knn_augmented", "knn_clean")} for r in untrained]
        rows.append(("untrained encoder", knn_only))
    for name, finals in rows:
        cells = []
        for key in FIGURES:
            if key not in finals[0]:
                cells.append("–")
                continue
            s = stats([f[key] for f in finals])
            digits = 1 if key == "directions" else 3
            cells.append(
                f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} "
                f"[{s['min']:.{digits}f}, {s['max']:.{digits}f}]"
            )
        lines.append(f"| {name} | {len(finals)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source(*objects):
    """The source code of these functions or classes, for a chapter to show."""
    import inspect

    from IPython.display import Code

    return Code("\n\n".join(inspect.getsource(o) for o in objects), language="python")
