"""Execute the book's changed notebooks in parallel, into Jupyter Book's execution cache.

`make book` runs this before `jupyter-book build`. Jupyter Book 1 (MyST-NB) runs the
notebooks one after another; they are independent, so this runs them side by side,
one kernel per core, into the cache MyST-NB reads. MyST-NB then finds every notebook
in the cache and executes nothing.

It does what MyST-NB's "cache" mode does for one notebook (myst_nb/core/execute/
cache.py), for all of them at once:

- the same key: jupyter-cache's own hash of the notebook (its code cells with their
  metadata, and the kernelspec), so a notebook is executed here exactly when MyST-NB
  would execute it, and its result is found there (tests/test_execute_chapters.py
  checks that the build then executes nothing);
- the same settings, read from ``_config.yml`` by Jupyter Book's own code: the
  per-cell ``timeout``, ``allow_errors`` (a cell tagged ``raises-exception`` may fail
  whatever it says: nbclient decides per cell, here as in the build),
  ``run_in_temp`` (false: a notebook runs with its own folder as working
  directory), ``cache`` and ``exclude_patterns``;
- the same execution: ``single_nb_execution`` of jupyter-cache, and the same record
  (``execution_seconds``), so each page's "Verified" stamp reads the same data.

It is jupyter-cache's ``local-parallel`` executor (JupyterExecutorLocalMproc), with
three changes:

- every write to the cache's SQLite database (and its ``executed/`` folder) happens
  under an exclusive file lock, ``<cache>/.write-lock``: the workers finish at the
  same moments and would otherwise write the database concurrently;
- a notebook that fails is reported by name, cell number, first line of the cell
  and the error, and the exit status is 1 (jupyter-cache's own command line exits
  0 whatever happened);
- the longest notebooks (by their last recorded run) start first, one at a time
  per worker, so that the longest one does not start last.

Every kernel runs book/_ext/kernel_startup.py first, as the kernels of the build do.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mproc
import os
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import nbformat
from jupyter_cache import get_cache
from jupyter_cache.cache.db import NbProjectRecord
from jupyter_cache.executors.base import ExecutorRunResult
from jupyter_cache.executors.basic import (
    ExecutionWorkerLocalMProc,
    JupyterExecutorLocalMproc,
    ProcessData,
)
from jupyter_cache.executors.utils import create_cache_bundle, single_nb_execution

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from book_inputs import toc_notebooks  # noqa: E402
from stable_outputs import use_kernel_startup  # noqa: E402

LOCK_NAME = ".write-lock"
SECONDS_NAME = ".execution-seconds.json"


@dataclass
class Settings:
    """How the book build executes notebooks, as _config.yml says."""

    timeout: int
    allow_errors: bool
    in_temp: bool
    cache: Path
    mode: str
    exclude: list[str] = field(default_factory=list)


def book_settings(root: Path = ROOT) -> Settings:
    """The execution settings of the build, read by Jupyter Book's and MyST-NB's own code.

    Jupyter Book maps _config.yml (``execute:``, ``sphinx: config:``) to MyST-NB's
    ``nb_*`` settings; MyST-NB's defaults fill in the rest.
    """
    from jupyter_book.config import get_final_config
    from myst_nb.core.config import NbParserConfig

    config, _ = get_final_config(
        user_yaml=root / "_config.yml",
        cli_config={"latex_individualpages": False},
        sourcedir=root,
    )
    defaults = NbParserConfig()

    def value(name):
        return config.get(f"nb_{name}", getattr(defaults, name))

    # MyST-NB: an empty cache path means <build folder>/.jupyter_cache
    cache = value("execution_cache_path") or root / "_build" / ".jupyter_cache"
    return Settings(
        timeout=value("execution_timeout"),
        allow_errors=bool(value("execution_allow_errors")),
        in_temp=bool(value("execution_in_temp")),
        cache=(root / cache).resolve(),
        mode=str(value("execution_mode")),
        exclude=list(value("execution_excludepatterns") or []),
    )


def is_excluded(path: Path, patterns: list[str]) -> bool:
    # as MyST-NB matches nb_execution_excludepatterns
    return any(PurePosixPath(path.as_posix()).match(p) for p in patterns)


def own_execution_settings(path: Path) -> list[str]:
    """The execution settings a notebook overrides in its own metadata ("mystnb").

    MyST-NB applies them to that notebook only (execution_mode "off", another
    timeout, ...). This executor runs every notebook with the book's settings, so a
    notebook with settings of its own is left to the build, which honours them.
    """
    own = nbformat.read(path, as_version=4).metadata.get("mystnb", {})
    return sorted(key for key in own if key.startswith("execution_"))


@contextmanager
def cache_write_lock(cache_path: Path | str):
    """Hold the exclusive lock that guards writes to the cache at cache_path."""
    path = Path(cache_path)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def where(nb, index: int | None) -> str:
    """'cell N (first line)' for the cell at index of nb."""
    if index is None:
        return "before its first cell"
    lines = [line for line in nb.cells[index].source.splitlines() if line.strip()]
    return f"cell {index} ({(lines[0].strip() if lines else '')[:60]!r})"


def failure_report(uri: str, nb, cell_index: int | None, err, exc_string: str) -> str:
    """What a failed notebook says: which notebook and cell, which error, then details."""
    name = Path(uri).name
    if hasattr(err, "ename"):
        error = f"{err.ename}: {err.evalue}"
    else:  # a cell that ran out of time, or a kernel that died
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return f"{name} failed at {where(nb, cell_index)}: {error}\n\n{exc_string}"


class LockedWorker(ExecutionWorkerLocalMProc):
    """jupyter-cache's local-parallel worker; cache writes under the lock, failures named."""

    def __init__(self, in_temp: bool = False):
        super().__init__()
        self.in_temp = in_temp

    def __call__(self, data: ProcessData) -> tuple[int, str]:
        cache_path = data.cache.path
        try:
            project_nb = data.cache.get_project_notebook(data.pk)
        except Exception as exc:
            _say(f"{Path(data.uri).name}: could not read it: {exc}")
            return (2, data.uri)
        started: dict[str, int | None] = {"cell": None}

        def on_cell_start(cell, cell_index):
            started["cell"] = cell_index

        # A notebook's own "mystnb" metadata overrides the book's settings in MyST-NB.
        own = project_nb.nb.metadata.get("mystnb", {})
        in_temp = own.get("execution_in_temp", self.in_temp)
        _say(f"executing {Path(project_nb.uri).name}")
        try:
            with tempfile.TemporaryDirectory() if in_temp else nullcontext(None) as temp:
                result = single_nb_execution(
                    project_nb.nb,
                    cwd=os.path.abspath(temp or Path(project_nb.uri).parent),
                    timeout=own.get("execution_timeout", data.timeout),
                    allow_errors=own.get("execution_allow_errors", data.allow_errors),
                    on_cell_start=on_cell_start,
                )
        except Exception as exc:  # the kernel died, or could not start
            report = failure_report(
                project_nb.uri, project_nb.nb, started["cell"], exc, traceback.format_exc()
            )
            with cache_write_lock(cache_path):
                NbProjectRecord.set_traceback(project_nb.uri, report, data.cache.db)
            return (2, data.uri)
        if result.err is not None:
            report = failure_report(
                project_nb.uri, project_nb.nb, started["cell"], result.err, result.exc_string
            )
            with cache_write_lock(cache_path):
                NbProjectRecord.set_traceback(project_nb.uri, report, data.cache.db)
            return (1, data.uri)
        bundle = create_cache_bundle(project_nb, result.cwd, None, result.time, None)
        with cache_write_lock(cache_path):
            data.cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
        _say(f"{Path(project_nb.uri).name} ran in {result.time:.1f} s")
        return (0, data.uri)


class ParallelExecutor(JupyterExecutorLocalMproc):
    """jupyter-cache's local-parallel executor: longest notebooks first, locked writes."""

    _EXECUTION_WORKER = LockedWorker

    def run_and_cache(
        self,
        *,
        filter_uris=None,
        filter_pks=None,
        timeout=30,
        allow_errors=False,
        force=False,
        in_temp=False,
        jobs=None,
        expected_seconds=None,
    ) -> ExecutorRunResult:
        with cache_write_lock(self.cache.path):
            records = self.get_records(filter_uris, filter_pks, clear_tracebacks=True, force=force)
        if not records:
            return ExecutorRunResult()
        expected = expected_seconds or {}
        records.sort(key=lambda r: expected.get(r.uri, 0.0), reverse=True)
        jobs = max(1, min(jobs or os.cpu_count() or 1, len(records)))
        _say(f"{len(records)} notebook(s) to execute, {jobs} at a time")
        work = [ProcessData(r.pk, r.uri, self.cache, timeout, allow_errors) for r in records]
        # chunksize 1: each worker takes the next notebook when it is free
        with mproc.Pool(jobs) as pool:
            results = list(pool.imap(self._EXECUTION_WORKER(in_temp), work, chunksize=1))
        return ExecutorRunResult(
            succeeded=[u for status, u in results if status == 0],
            excepted=[u for status, u in results if status == 1],
            errored=[u for status, u in results if status == 2],
        )


def _say(message: str) -> None:
    print(f"execute-chapters: {message}", file=sys.stderr, flush=True)


@dataclass
class Outcome:
    """What one run did: notebooks executed, found in the cache, and failures."""

    executed: list[str]
    cached: list[str]
    failures: dict[str, str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures


def _expected_seconds(cache, uris: list[str], seconds_file: Path) -> dict[str, float]:
    """The last recorded run time of each notebook, else its size as a rough guess."""
    known = {}
    if seconds_file.is_file():
        known = json.loads(seconds_file.read_text("utf-8"))
    for record in sorted(cache.list_cache_records(), key=lambda r: r.created):
        if record.uri in uris and record.data.get("execution_seconds"):
            known[record.uri] = record.data["execution_seconds"]
    return {u: known.get(u, Path(u).stat().st_size / 1e6) for u in uris}


def run(
    root: Path = ROOT,
    *,
    cache_path: Path | None = None,
    allow_errors: bool | None = None,
    jobs: int | None = None,
    force: bool = False,
) -> Outcome:
    """Execute every notebook of _toc.yml that the cache lacks; report what happened."""
    start = time.perf_counter()
    settings = book_settings(root)
    if settings.mode != "cache":
        _say(f"nothing to do: _config.yml executes notebooks in {settings.mode!r} mode")
        return Outcome([], [], {}, 0.0)
    cache_dir = Path(cache_path).resolve() if cache_path else settings.cache
    use_kernel_startup()
    cache = get_cache(cache_dir)
    notebooks = [p for p in toc_notebooks(root) if not is_excluded(p, settings.exclude)]
    for path in [p for p in notebooks if own_execution_settings(p)]:
        _say(f"{path.name} sets {', '.join(own_execution_settings(path))}: left to the build")
        notebooks.remove(path)
    with cache_write_lock(cache.path):
        uris = [cache.add_nb_to_project(str(p)).uri for p in notebooks]
    seconds_file = cache_dir.parent / SECONDS_NAME
    executor = ParallelExecutor(cache)
    result = executor.run_and_cache(
        filter_uris=uris,
        timeout=settings.timeout,
        allow_errors=settings.allow_errors if allow_errors is None else allow_errors,
        force=force,
        in_temp=settings.in_temp,
        jobs=jobs,
        expected_seconds=_expected_seconds(cache, uris, seconds_file),
    )
    failures = {}
    for uri in result.excepted + result.errored:
        record = cache.get_project_record(uri)
        failures[uri] = record.traceback or f"{Path(uri).name}: could not be executed"
    seconds = _expected_seconds(cache, uris, seconds_file)
    seconds_file.write_text(json.dumps(seconds, indent=1), "utf-8")
    return Outcome(
        executed=result.succeeded,
        cached=[u for u in uris if u not in result.all()],
        failures=failures,
        seconds=time.perf_counter() - start,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's folder")
    parser.add_argument("--cache", type=Path, help="another execution cache to fill")
    parser.add_argument("--jobs", type=int, help="kernels at a time (default: one per core)")
    parser.add_argument("--force", action="store_true", help="execute even what is cached")
    parser.add_argument(
        "--allow-errors",
        action="store_true",
        help="run every cell even after an error (the torch matrix compares them all)",
    )
    args = parser.parse_args(argv)
    outcome = run(
        args.root.resolve(),
        cache_path=args.cache,
        allow_errors=True if args.allow_errors else None,
        jobs=args.jobs,
        force=args.force,
    )
    _say(
        f"{len(outcome.executed)} executed, {len(outcome.cached)} from the cache, "
        f"{len(outcome.failures)} failed ({outcome.seconds:.1f} s)"
    )
    for report in outcome.failures.values():
        print(f"\nexecute-chapters: {report}", file=sys.stderr)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
