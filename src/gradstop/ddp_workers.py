"""What chapter 12's ranks run under DistributedDataParallel (DDP), on CPU and gloo.

Each function here runs on every rank of a ``gradstop.distributed.Cluster`` and
returns plain values (lists, numbers, strings) for the page to print and check. The
models are tiny and their weights are ones, so every gradient is a round number:
rank ``r`` feeds ``x = r + 1`` in every element, and rank 1's own gradient is twice
rank 0's wherever the gradient is linear in ``x``.

``Net`` is the chapter's model, a ``body`` and a ``head``; ``FORWARDS`` names the
ways its forward can join them, with and without a stop-gradient.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def rank_input(features: int = 3) -> torch.Tensor:
    """This rank's batch: one sample, every feature ``rank + 1``."""
    return torch.full((1, features), float(dist.get_rank() + 1))


def grad_of(param: torch.Tensor):
    """``param.grad`` as a flat list of floats, or None."""
    return None if param.grad is None else param.grad.flatten().tolist()


def average_of_ranks() -> list:
    """Each rank sends rank + 1; all_reduce returns the sum to every rank."""
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)  # SUM by default
    return t.tolist()


def wait_for_ever() -> None:
    """A rank that never answers (to show the cluster's timeout)."""
    torch.distributed.barrier()  # rank 0 waits here for rank 1...
    if dist.get_rank() == 1:
        while True:  # ...which never comes back
            time.sleep(1)


# --- the model, with and without a stop-gradient ------------------------------------


def _plain(net, x):
    return net.head(net.body(x))


def _detached(net, x):
    return net.head(net.body(x).detach())


def _no_grad(net, x):
    with torch.no_grad():
        h = net.body(x)
    return net.head(h)


def _unused(net, x):
    net.body(x)  # computed, then not used
    return net.head(x)


def _one_use_detached(net, x):
    z = net.body(x)  # as SimSiam's loss: one use of z detached, the other not
    return net.head(z) * z.detach().sum()


def _every_other_step(net, x):
    net.steps += 1
    return _detached(net, x) if net.steps % 2 == 0 else _plain(net, x)


def _odd_steps(net, x):
    net.steps += 1
    return _detached(net, x) if net.steps % 2 == 1 else _plain(net, x)


FORWARDS = {
    "head(body(x))": _plain,
    "head(body(x).detach())": _detached,
    "no_grad(): h = body(x); head(h)": _no_grad,
    "body(x) computed, head(x) used": _unused,
    "head(z) * z.detach().sum()": _one_use_detached,
    "detach() every other step": _every_other_step,
    "detach() on odd steps": _odd_steps,
}


class Net(nn.Module):
    """``head(body(x))``, weights all ones; ``forward`` names how the two are joined."""

    def __init__(self, forward: str = "head(body(x).detach())"):
        super().__init__()
        if forward not in FORWARDS:
            raise ValueError(f"forward must be one of {list(FORWARDS)}, got {forward!r}")
        self.body = nn.Linear(3, 3, bias=False)
        self.head = nn.Linear(3, 1, bias=False)
        nn.init.ones_(self.body.weight)
        nn.init.ones_(self.head.weight)
        self.join, self.steps = FORWARDS[forward], 0

    def forward(self, x):
        return self.join(self, x)


def _ddp_report(model: DDP) -> dict:
    """What DDP itself reports about its buckets (a private method, stable since 1.9)."""
    data = model._get_ddp_logging_data()
    return {
        "bucket bytes": int(data.get("bucket_sizes", "0").split(",")[0] or 0),
        "unused bytes": data.get("unused_parameter_size", 0),
    }


DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")


def train_steps(
    forward="head(body(x).detach())", steps=2, freeze=False, catch=False, debug="OFF", **options
):
    """``steps`` forward and backward passes of ``DDP(Net(forward), **options)``.

    ``freeze=True`` freezes the body before wrapping, ``freeze="after"`` after;
    ``debug`` is TORCH_DISTRIBUTED_DEBUG for this run. Returns each step's gradients
    (``"body"``, ``"head"``: flat lists or None), the step that raised, its message's
    first line and its lines naming the parameters without a gradient (with
    ``catch=True``; otherwise the error propagates), and DDP's report on its buckets.
    """
    if freeze not in (False, True, "after"):
        raise ValueError(f"freeze must be False, True or 'after', got {freeze!r}")
    if debug not in DEBUG_LEVELS:
        raise ValueError(f"debug must be one of {DEBUG_LEVELS}, got {debug!r}")
    with _debug_level(debug):
        return _train_steps(forward, steps, freeze, catch, options)


@contextlib.contextmanager
def _debug_level(level: str):
    """TORCH_DISTRIBUTED_DEBUG=level for one run, read as at a process's start."""
    before = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = level
    dist.set_debug_level_from_env()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TORCH_DISTRIBUTED_DEBUG"]
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = before
        dist.set_debug_level_from_env()


def _train_steps(forward, steps, freeze, catch, options) -> dict:
    net = Net(forward)
    if freeze is True:
        net.body.requires_grad_(False)  # frozen before DDP sees it
    model = DDP(net, **options)
    if freeze == "after":
        net.body.requires_grad_(False)  # too late: DDP has listed it
    seen, failed = [], None
    for step in range(1, steps + 1):
        try:
            model.zero_grad()
            model(rank_input()).sum().backward()
        except RuntimeError as err:
            if not catch:
                raise
            lines = str(err).splitlines()
            failed = (step, lines[0], [line for line in lines if line.startswith("Parameter")])
            break
        seen.append({"body": grad_of(net.body.weight), "head": grad_of(net.head.weight)})
    return {"steps": seen, "failed": failed, **_ddp_report(model)}


def _detached_on_rank_0(net, x):
    return _detached(net, x) if dist.get_rank() == 0 else _plain(net, x)


def detach_on_rank_0():
    """One step of a Net that detaches the body on rank 0 only (find_unused_parameters)."""
    net = Net("head(body(x))")
    net.join = _detached_on_rank_0
    model = DDP(net, find_unused_parameters=True)
    model(rank_input()).sum().backward()
    return {"body": grad_of(net.body.weight), "head": grad_of(net.head.weight)}


# --- hooks and DDP's reduction ------------------------------------------------------


def hooks_and_reduction(scale_on_rank_0=None, wrap="eager DDP(net)", backend="aot_eager"):
    """Who sees which gradient, in which order, on each rank.

    A tensor hook and a post-accumulate-grad hook on the weight of ``Linear(3, 1)``,
    and a communication hook that records the bucket before and after its
    all-reduce. ``scale_on_rank_0="tensor hook"`` (or ``"post-accumulate hook"``)
    makes that hook multiply rank 0's gradient by 10; ``wrap`` (one of ``WRAPS``)
    compiles the model outside or inside DDP.
    """
    layer = nn.Linear(3, 1, bias=False)
    ddp, model = wrapped(layer, wrap, backend)
    rank = dist.get_rank()
    weight = layer.weight
    events = []

    def tensor_hook(grad):
        events.append(("tensor hook", grad.flatten().tolist()))
        if rank == 0 and scale_on_rank_0 == "tensor hook":
            return grad * 10

    def post_accumulate_hook(param):
        events.append(("post-accumulate hook", param.grad.flatten().tolist()))
        if rank == 0 and scale_on_rank_0 == "post-accumulate hook":
            param.grad.mul_(10)

    weight.register_hook(tensor_hook)
    weight.register_post_accumulate_grad_hook(post_accumulate_hook)
    ddp.register_comm_hook(events, recording_allreduce)
    (model(rank_input()).sum() * 2).backward()
    events.append((".grad after backward()", grad_of(weight)))
    torch._dynamo.reset()  # the next run's layer is compiled afresh
    return events


def recording_allreduce(events: list, bucket):
    """A communication hook: DDP's average, recorded before and after."""
    buffer = bucket.buffer()
    events.append(("comm hook: bucket in", buffer.tolist()))
    buffer.div_(dist.get_world_size())
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def done(fut):
        events.append(("comm hook: bucket out", fut.value()[0].tolist()))
        return fut.value()[0]

    return future.then(done)


# --- gradient accumulation with no_sync() -------------------------------------------


def accumulate(inside: int = 2):
    """``inside`` backward passes under ``no_sync()``, then one outside it.

    Returns ``.grad`` of ``Linear(3, 1)``'s weight after each backward pass.
    """
    model = DDP(nn.Linear(3, 1, bias=False))
    seen = []
    with model.no_sync():
        for _ in range(inside):
            model(rank_input()).sum().backward()
            seen.append(grad_of(model.module.weight))
    model(rank_input()).sum().backward()
    seen.append(grad_of(model.module.weight))
    return seen


def accumulate_detached(inside: int = 2):
    """``accumulate`` for the detaching ``Net``: the head's ``.grad`` after each backward
    pass, then the next forward pass's outcome (its error's first line, or "runs")."""
    model = DDP(Net("head(body(x).detach())"))
    seen = []
    with model.no_sync():
        for _ in range(inside):
            model(rank_input()).sum().backward()
            seen.append(grad_of(model.module.head.weight))
    model(rank_input()).sum().backward()
    seen.append(grad_of(model.module.head.weight))
    try:
        model(rank_input())
    except RuntimeError as err:
        return seen, str(err).splitlines()[0]
    return seen, "runs"


def step_inside_no_sync(inside: int = 2):
    """An optimizer step inside ``no_sync()``: each rank's weight afterwards."""
    model = DDP(nn.Linear(3, 1, bias=False))
    nn.init.ones_(model.module.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with model.no_sync():
        for _ in range(inside):
            model(rank_input()).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return model.module.weight.flatten().tolist()


# --- communication hooks ------------------------------------------------------------

LOCAL = [0.1, 1 / 3, 1e-5]  # rank r's gradient is (r + 1) times these


def compressed(hook: str = "none"):
    """The averaged gradient with DDP's default reduction or a compressing hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = DDP(nn.Linear(3, 1, bias=False))
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook != "none":
        raise ValueError(f"hook must be 'none' or 'fp16', got {hook!r}")
    x = torch.tensor([LOCAL]) * (dist.get_rank() + 1)
    model(x).sum().backward()
    return grad_of(model.module.weight)


# --- SyncBatchNorm on CPU: PyTorch's own function, with CPU versions of its kernels --
#
# nn.SyncBatchNorm refuses CPU tensors, and the five statistics kernels its autograd
# function calls (torch.batch_norm_stats and four others) exist only for GPUs. To watch
# what it communicates on this machine, each rank registers CPU versions of those five
# kernels, written from their definitions, and calls PyTorch's SyncBatchNorm function
# itself (torch.nn.modules._functions.SyncBatchNorm): one all_gather in the forward
# and one all_reduce in the backward, as many collectives as a GPU run makes (with
# gloo, the function gathers with all_gather rather than all_gather_into_tensor,
# which gloo lacks). The tests check the
# result against BatchNorm1d over the whole batch of every rank.

_KERNELS = []  # the torch.library registration, kept alive while the process lives


def _shape(t, like):
    """A per-channel vector shaped to broadcast over ``like`` (channels in dim 1)."""
    return t.view(1, -1, *([1] * (like.dim() - 2)))


def _dims(t):
    return [d for d in range(t.dim()) if d != 1]


def _stats(x, eps):
    var = x.var(_dims(x), unbiased=False)
    return x.mean(_dims(x)), (var + eps).rsqrt()


def _gather_stats(x, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts):
    n = counts.sum()
    weights = (counts / n).unsqueeze(1)
    mean = (weights * mean_all).sum(0)
    var = (weights * (invstd_all.pow(-2) - eps + (mean_all - mean) ** 2)).sum(0)
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(momentum * mean)
    if running_var is not None:
        running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    return mean, (var + eps).rsqrt()


def _elemt(x, weight, bias, mean, invstd, eps):
    out = (x - _shape(mean, x)) * _shape(invstd, x)
    if weight is not None:
        out = out * _shape(weight, x)
    return out if bias is None else out + _shape(bias, x)


def _backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    sum_dy = dy.sum(_dims(x))
    sum_dy_xmu = (dy * (x - _shape(mean, x))).sum(_dims(x))
    grad_weight = sum_dy_xmu * invstd if weight_g else torch.empty(0)
    return sum_dy, sum_dy_xmu, grad_weight, sum_dy if bias_g else torch.empty(0)


def _backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    n = count.sum().to(x.dtype)
    xmu = x - _shape(mean, x)
    inner = dy - _shape(sum_dy / n, x) - xmu * _shape(invstd**2 * sum_dy_xmu / n, x)
    scale = invstd if weight is None else invstd * weight
    return inner * _shape(scale, x)


def register_cpu_sync_batchnorm_kernels() -> None:
    """Give SyncBatchNorm's five GPU-only kernels CPU versions, in this process."""
    if _KERNELS:
        return
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in (
        ("batch_norm_stats", _stats),
        ("batch_norm_gather_stats_with_counts", _gather_stats),
        ("batch_norm_elemt", _elemt),
        ("batch_norm_backward_reduce", _backward_reduce),
        ("batch_norm_backward_elemt", _backward_elemt),
    ):
        library.impl(name, kernel, "CPU")
    _KERNELS.append(library)


class CpuSyncBatchNorm(nn.BatchNorm1d):
    """BatchNorm1d whose training forward is PyTorch's SyncBatchNorm function."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        from torch.nn.modules._functions import SyncBatchNorm as sync_batch_norm

        register_cpu_sync_batchnorm_kernels()
        self.num_batches_tracked.add_(1)
        group, size = dist.group.WORLD, dist.get_world_size()
        return sync_batch_norm.apply(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.eps,
            self.momentum,
            group,
            size,
        )


class Counted:
    """Counts the calls of torch.distributed.all_gather and all_reduce while active.

    SyncBatchNorm's function calls both through ``torch.distributed``; DDP's own
    gradient reduction does not (it runs in C++), so it is not counted.
    """

    NAMES = ("all_gather", "all_reduce")

    def __enter__(self):
        self.calls, self._saved = [], {n: getattr(dist, n) for n in self.NAMES}
        for name, original in self._saved.items():
            setattr(dist, name, self._counting(name, original))
        return self

    def _counting(self, name, original):
        def call(*args, **kwargs):
            self.calls.append(name)
            return original(*args, **kwargs)

        return call

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(dist, name, original)


def sync_batchnorm_refused():
    """nn.SyncBatchNorm's own forward, on CPU, in training mode."""
    bn = nn.SyncBatchNorm(4)
    return bn(torch.randn(8, 4)).tolist()


SIMSIAM_VARIANTS = (
    "stop-gradient (SimSiam)",
    "no stop-gradient",
    "target detached",
    "target under no_grad()",
)


def _views(rank, batch=4):
    """Rank ``rank``'s two views: seeded by the rank, so any rank can remake them."""
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(batch, 4, generator=gen), torch.randn(batch, 4, generator=gen)


class TinySimSiam(nn.Module):
    """SimSiam's shape, tiny: projector Linear + batch norm, predictor Linear."""

    def __init__(self, norm=CpuSyncBatchNorm):
        super().__init__()
        torch.manual_seed(0)  # the same weights on every rank and in the reference
        self.projector = nn.Sequential(nn.Linear(4, 4), norm(4))
        self.predictor = nn.Linear(4, 4)

    def forward(self, x1, x2, variant):
        cos = nn.functional.cosine_similarity
        z1 = self.projector(x1)
        p1 = self.predictor(z1)
        if variant == "target detached":  # one-sided: z2 has no other use
            return -cos(p1, self.projector(x2).detach()).mean(), z1
        if variant == "target under no_grad()":  # one-sided, as a target network
            with torch.no_grad():
                z2 = self.projector(x2)
            return -cos(p1, z2).mean(), z1
        z2 = self.projector(x2)
        p2 = self.predictor(z2)
        if variant == "stop-gradient (SimSiam)":
            z1, z2 = z1.detach(), z2.detach()
        return -(cos(p1, z2).mean() + cos(p2, z1).mean()) / 2, z1


def simsiam_sync_batchnorm(variant="stop-gradient (SimSiam)", sync=True):
    """One SimSiam step under DDP: what SyncBatchNorm communicated, and whether the
    ranks together computed what one process computes on the whole batch."""
    if variant not in SIMSIAM_VARIANTS:
        raise ValueError(f"variant must be one of {SIMSIAM_VARIANTS}, got {variant!r}")
    rank, size = dist.get_rank(), dist.get_world_size()
    norm = CpuSyncBatchNorm if sync else nn.BatchNorm1d
    model = DDP(TinySimSiam(norm))
    x1, x2 = _views(rank)
    with Counted() as forward:
        loss, z1 = model(x1, x2, variant)
    with Counted() as backward:
        loss.backward()
    # The same step in one process, on every rank's views at once.
    whole = TinySimSiam(nn.BatchNorm1d)
    views = [_views(r) for r in range(size)]
    x1_all, x2_all = (torch.cat(v) for v in zip(*views, strict=True))
    whole_loss, whole_z1 = whole(x1_all, x2_all, variant)
    whole_loss.backward()
    mine = slice(rank * len(x1), (rank + 1) * len(x1))
    grads = [p.grad for p in model.module.parameters()]
    return {
        "forward": forward.calls,
        "backward": backward.calls,
        "z1 as one process": torch.allclose(z1, whole_z1[mine], atol=1e-5),
        "grads as one process": all(
            torch.allclose(g, w.grad, atol=1e-5)
            for g, w in zip(grads, whole.parameters(), strict=True)
        ),
        "running mean": model.module.projector[1].running_mean.tolist(),
        "whole running mean": whole.projector[1].running_mean.tolist(),
    }


# --- DDP and torch.compile -----------------------------------------------------------

WRAPS = ("eager DDP(net)", "compile(DDP(net))", "DDP(compile(net))")


def wrapped(net: nn.Module, wrap: str, backend: str = "aot_eager", **options):
    """``net`` in DDP (``**options``), compiled as ``wrap`` (one of ``WRAPS``) says:
    the DDP module (for a communication hook) and the module to call."""
    if wrap not in WRAPS:
        raise ValueError(f"wrap must be one of {WRAPS}, got {wrap!r}")
    if wrap == "DDP(compile(net))":
        ddp = DDP(torch.compile(net, backend=backend), **options)
        return ddp, ddp
    ddp = DDP(net, **options)
    return ddp, torch.compile(ddp, backend=backend) if wrap == "compile(DDP(net))" else ddp


def compiled_steps(wrap="compile(DDP(net))", steps=3, backend="aot_eager", **options):
    """``steps`` passes of the detaching ``Net`` under DDP, compiled as ``wrap`` says.

    Returns each step's gradients (as ``train_steps`` does), the step that raised
    and its message's first line, and the body's weight after one AdamW step with
    weight decay (lr 0.1, weight_decay 0.1): AdamW skips a parameter whose ``.grad``
    is None and decays one whose ``.grad`` is a tensor, zeros or not.
    """
    net = Net("head(body(x).detach())")
    _, model = wrapped(net, wrap, backend, **options)
    seen, failed = [], None
    for step in range(1, steps + 1):
        try:
            net.zero_grad()  # set_to_none: a tensor after backward() was written by it
            model(rank_input()).sum().backward()
        except RuntimeError as err:
            failed = (step, str(err).splitlines()[0])
            break
        seen.append({"body": grad_of(net.body.weight), "head": grad_of(net.head.weight)})
    body_after = None
    if failed is None:
        torch.optim.AdamW(net.parameters(), lr=0.1, weight_decay=0.1).step()
        body_after = net.body.weight.flatten().tolist()
    torch._dynamo.reset()  # the next run's Net is compiled afresh
    return {"steps": seen, "failed": failed, "body after AdamW": body_after}


class BigNet(nn.Module):
    """``head(body(x).detach())`` with 700 features: its 3.9 MB of gradients are more
    than the 1 MiB of DDP's first bucket, so the compiler splits the graph there."""

    def __init__(self, features: int = 700):
        super().__init__()
        self.features = features
        self.body = nn.Linear(features, features, bias=False)
        self.head = nn.Sequential(
            nn.Linear(features, features, bias=False), nn.Linear(features, 1, bias=False)
        )

    def forward(self, x):
        return self.head(self.body(x).detach())


def _state(grad) -> str:
    if grad is None:
        return "None"
    return "zeros" if not bool(grad.any()) else "non-zero"


def compiled_big_steps(wrap="compile(DDP(net))", steps=3, optimize_ddp=True, backend="aot_eager"):
    """``compiled_steps`` for ``BigNet``: the step that raised (and its message's first
    line), and what the body's ``.grad`` held after each step that ran. ``optimize_ddp``
    is ``torch._dynamo.config.optimize_ddp`` (splitting the graph at DDP's buckets)."""
    net = BigNet()
    with torch._dynamo.config.patch(optimize_ddp=optimize_ddp):
        _, model = wrapped(net, wrap, backend)
        seen, failed = [], None
        x = torch.full((1, net.features), float(dist.get_rank() + 1))
        for step in range(1, steps + 1):
            try:
                net.zero_grad()
                model(x).sum().backward()
            except RuntimeError as err:
                failed = (step, str(err).splitlines()[0])
                break
            seen.append(_state(net.body.weight.grad))
    torch._dynamo.reset()
    return {"failed": failed, "body": seen}
