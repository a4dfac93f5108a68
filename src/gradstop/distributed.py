"""Chapter 12's runner: a few processes on this machine, in one gloo process group.

A notebook cannot hand a function it defines to a process started with ``spawn``
(the new process imports the function by its module's name, and a notebook is not
a module), so what the ranks run lives in a module (chapter 12's experiments are in
``gradstop.ddp_workers``), and the chapter shows each one's source with ``show``::

    from gradstop import distributed as gpd, ddp_workers
    cluster = gpd.Cluster(world_size=2)                  # two processes, one group
    ranks = cluster.run(ddp_workers.hooks_and_reduction)  # rank 0's result, rank 1's
    cluster.close()

``Cluster`` starts ``world_size`` processes at its first run, joins them into one
process group on the gloo backend over 127.0.0.1 only, and keeps them for every
later run: starting a process that imports torch takes seconds, a run milliseconds.
``run(worker, **kwargs)`` calls ``worker(**kwargs)`` on every rank and returns the
ranks' results in rank order (plain values: numbers, strings, lists and dicts).

Every run is bounded in time. A rank that has not answered within ``timeout``
seconds is stopped with the others, and ``run`` raises ``TimeoutError`` naming the
run and the silent ranks, instead of hanging the notebook (and the book's build).
A rank that raises makes ``run`` raise the same exception type with the same
message in the caller (the lowest failing rank's; a note names the rank and the
run), so a notebook cell shows and checks a worker's error like any other. After
an error every rank leaves its process group and joins a new one: a collective left
half done must not meet the next run. After a timeout, new processes start.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import itertools
import os
import queue
import re
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HOST = "127.0.0.1"  # the only address a rank listens on or connects to
GRACE = 5.0  # seconds the other ranks get to answer once one rank has raised
# DistributedDataParallel's constructor imports torch._dynamo: seconds per process,
# paid while the processes start rather than in the first run.
PRELOAD = ("torch._dynamo",)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _loopback_interface() -> str | None:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS), for gloo."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name.startswith("lo")), None)


def _join(rank: int, world_size: int, port: int, timeout: float) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{HOST}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )


class _StderrLog:
    """This process's standard error (file descriptor 2, where PyTorch's C++ warnings
    go) sent to a file, read back after each task."""

    def __init__(self):
        descriptor, path = tempfile.mkstemp(prefix="gradstop-rank-", suffix=".log")
        os.dup2(descriptor, 2)
        os.close(descriptor)
        self._reader = open(path, "rb")  # noqa: SIM115 - open while the process lives
        os.unlink(path)  # the file lives on until both ends are closed

    def new_lines(self) -> list[str]:
        sys.stderr.flush()
        text = self._reader.read().decode("utf-8", "replace")
        return [_C10_PREFIX.sub("", line) for line in text.splitlines() if line.strip()]


# "[rank0]:[W1202 01:43:45.774972239 reducer.cpp:1529] Warning: " before a C++ warning
_C10_PREFIX = re.compile(r"^(\[rank\d+\]:)?\[[WEI]\d{4} [\d:.]+ [^\]]+\] (Warning: )?")


def _rank_main(rank, world_size, port, timeout, preload, inbox, outbox):
    """One rank: join the group, then run each task that arrives, until told to stop."""
    interface = _loopback_interface()
    if interface:  # gloo must not pick an outside interface from the host's name
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    torch.set_num_threads(1)  # the ranks share the machine's cores
    stderr = _StderrLog()
    for module in preload:  # imported here, at start, rather than in the first run
        importlib.import_module(module)
    _join(rank, world_size, port, timeout)
    outbox.put(("ready", rank, "ok", None, stderr.new_lines()))
    while (task := inbox.get()) is not None:
        number, worker, kwargs = task
        if worker == "rejoin":  # leave the group, join a fresh one on a new port
            dist.destroy_process_group()
            _join(rank, world_size, kwargs["port"], timeout)
            outbox.put((number, rank, "ok", None, stderr.new_lines()))
            continue
        torch.manual_seed(0)  # every run starts from the same generator state
        try:
            status, payload = "ok", worker(**kwargs)
        except Exception as err:  # every error goes back to the caller
            status = "error"
            payload = (type(err).__module__, type(err).__name__, str(err), traceback.format_exc())
        outbox.put((number, rank, status, payload, stderr.new_lines()))
    dist.destroy_process_group()


def same_error(module: str, name: str, message: str) -> Exception:
    """An exception of the worker's built-in type with its message, else RuntimeError."""
    kind = getattr(builtins, name, None) if module == "builtins" else None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except TypeError:  # a built-in exception that needs more than a message
            pass
    return RuntimeError(f"{module}.{name}: {message}")


class Cluster:
    """``world_size`` processes in one gloo process group on 127.0.0.1.

    ``timeout`` bounds every run and every collective, in seconds; ``start_timeout``
    bounds starting the processes (each imports torch and the modules ``preload``
    names: seconds on a busy machine).
    """

    def __init__(
        self,
        world_size: int = 2,
        timeout: float = 60,
        start_timeout: float = 120,
        preload: tuple[str, ...] = PRELOAD,
    ):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.world_size = world_size
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.preload = tuple(preload)
        self.starts = 0  # how many times processes were started
        # What each rank wrote to its standard error during the last run (PyTorch's
        # C++ warnings among it), one list of lines per rank.
        self.stderr: list[list[str]] = [[] for _ in range(world_size)]
        self._processes: list = []
        self._inboxes: list = []
        self._numbers = itertools.count(1)

    def __repr__(self) -> str:
        state = "running" if self._processes else "not started"
        return f"Cluster(world_size={self.world_size}, timeout={self.timeout:g}: {state})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # starting and stopping

    def _start(self) -> None:
        context = mp.get_context("spawn")
        self._outbox = outbox = context.Queue()
        self._inboxes = [context.Queue() for _ in range(self.world_size)]
        port = free_port()
        self._processes = [
            context.Process(
                target=_rank_main,
                args=(rank, self.world_size, port, self.timeout, self.preload, inbox, outbox),
                daemon=True,
                name=f"gradstop-rank-{rank}",
            )
            for rank, inbox in enumerate(self._inboxes)
        ]
        for process in self._processes:
            process.start()
        self.starts += 1
        self._collect("ready", "starting the cluster's processes", self.start_timeout)

    def close(self) -> None:
        """Stop the processes; a later run starts new ones."""
        for inbox, process in zip(self._inboxes, self._processes, strict=False):
            if process.is_alive():
                inbox.put(None)
        for process in self._processes:
            process.join(5)
        self._kill()

    def _kill(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        self._processes, self._inboxes = [], []

    # running

    def _send(self, worker, kwargs: dict) -> int:
        number = next(self._numbers)
        for inbox in self._inboxes:
            inbox.put((number, worker, kwargs))
        return number

    def _collect(self, number, what: str, timeout: float) -> dict:
        """Each rank's answer to task ``number``: {rank: (status, payload)}.

        Raises TimeoutError if a rank is silent at the deadline, RuntimeError if a
        rank's process died. Once a rank has reported an error the others get
        ``GRACE`` seconds more (they may be waiting for it in a collective); then
        the answers so far are returned, so the caller sees the error.
        """
        answers: dict = {}
        deadline = time.monotonic() + timeout
        while len(answers) < self.world_size:
            now = time.monotonic()
            if now >= deadline:
                silent = [r for r in range(self.world_size) if r not in answers]
                self._kill()
                if any(status == "error" for status, _ in answers.values()):
                    return answers
                raise TimeoutError(
                    f"{what} did not finish within {timeout:g} s: rank(s) {silent} "
                    "gave no answer, so every rank was stopped (the next run starts "
                    "new processes)"
                )
            try:
                got, rank, status, payload, lines = self._outbox.get(
                    timeout=min(deadline - now, 0.5)
                )
            except queue.Empty:
                self._fail_if_dead(what, answers)
                continue
            if got == number:
                answers[rank] = (status, payload)
                self.stderr[rank] = lines
                if status == "error":
                    deadline = min(deadline, time.monotonic() + GRACE)
        return answers

    def _fail_if_dead(self, what: str, answers: dict) -> None:
        """RuntimeError if a rank that has not answered has exited."""
        dead = [r for r, p in enumerate(self._processes) if not p.is_alive() and r not in answers]
        if dead:
            codes = {r: self._processes[r].exitcode for r in dead}
            self._kill()
            raise RuntimeError(
                f"{what}: rank(s) {dead} exited without an answer (exit codes {codes})"
            )

    def _rejoin(self) -> None:
        """Every rank leaves its process group and joins a new one (after an error)."""
        number, kept = self._send("rejoin", {"port": free_port()}), self.stderr
        self._collect(number, "rejoining the process group", self.start_timeout)
        self.stderr = kept  # what the failed run wrote, not the rejoining

    def run(self, worker, name: str | None = None, timeout: float | None = None, **kwargs):
        """Run ``worker(**kwargs)`` on every rank; return the results in rank order.

        ``worker`` must be importable by its module and name (a function defined at
        the top level of a module, not in a notebook). ``name`` names the run in
        errors (the worker's name by default); ``timeout`` overrides the cluster's.
        """
        qualname = getattr(worker, "__qualname__", "")
        if not callable(worker) or not qualname or "<" in qualname:
            raise TypeError(
                f"worker must be a function defined at the top level of a module, got {worker!r}"
            )
        if getattr(worker, "__module__", "__main__") == "__main__":
            raise TypeError(
                f"{qualname} is defined in __main__ (a notebook or a script): the ranks "
                "cannot import it; define it in a module and import it from there"
            )
        name = name or worker.__name__
        self.stderr = [[] for _ in range(self.world_size)]
        if not self._processes:
            self._start()
        number = self._send(worker, kwargs)
        limit = self.timeout if timeout is None else timeout
        answers = self._collect(number, f"the distributed run {name!r}", limit)
        failed = sorted(rank for rank, (status, _) in answers.items() if status == "error")
        if not failed:
            return [answers[rank][1] for rank in range(self.world_size)]
        silent = [r for r in range(self.world_size) if r not in answers]
        if self._processes:
            self._rejoin()
        module, kind, message, trace = answers[failed[0]][1]
        error = same_error(module, kind, message)
        note = f"(raised in rank {failed[0]} of the distributed run {name!r}; "
        note += f"ranks that raised: {failed}"
        note += f"; stopped while silent: {silent})" if silent else ")"
        error.add_note(note)
        error.worker_traceback = trace
        error._render_traceback_ = lambda: _one_line(error)
        raise error


def _one_line(error: Exception) -> list[str]:
    """How IPython shows a worker's error: type, message (its line breaks as spaces),
    notes. The exception keeps the message exactly; only the display joins its lines,
    so that the book's traceback highlighter reads every word of it as the message."""
    message = " ".join(line.strip() for line in str(error).splitlines())
    return [f"{type(error).__name__}: {message}", *getattr(error, "__notes__", [])]


def show(worker):
    """A worker's source (a function or a class) as a Markdown code block, to display."""
    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(worker).rstrip()}\n```")
