"""`make bench`: how fast the book builds, against the chapters' own compute.

Measured in a scratch copy of the repository (under _build/bench-work/, sharing
.venv), so your own _build/ and working tree are left alone:

- compute floor: each chapter executed on its own, one after another, on a fresh
  kernel (nbclient). The serial floor is the sum of those times; the parallel floor
  is the larger of the longest chapter and the sum shared out over the cores (no
  build can beat it: with 2 cores, the longest chapter or half the sum);
- clean build: `make book` from an empty _build/ and execution cache (chapters
  executed in parallel, scripts/execute_chapters.py), with the peak memory of the
  whole process tree (make, Sphinx, the kernels), sampled;
- serial build: the same without the parallel executor (Jupyter Book executing the
  chapters one after another, as before it), from an empty _build/ too; its pages
  must be byte-identical to the clean build's (scripts/compare_builds.py);
- no-change rebuild: `make book` again;
- one-chapter edit: a code cell of one chapter changed, `make book`, and which
  chapters were re-executed (read from the execution cache);
- page weight: the largest page with its images, and all of _build/html.

Timings run BENCH_RUNS times (default 3) and are reported as min/median/max: the
machine is shared and noisy, so compare ratios from one run, not absolute seconds.
Targets are reported, never asserted. Writes _build/bench.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
from bs4 import BeautifulSoup
from jupyter_cache import get_cache

import nbcheck  # beside this script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import compare_builds  # noqa: E402
from stable_outputs import use_kernel_startup  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
EDITED = "notebooks/02-detach.ipynb"


def scratch_copy() -> Path:
    work = ROOT / "_build" / "bench-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return nbcheck.clone_copy(work)


# The build without the parallel executor: what `make book` did before it.
SERIAL_BOOK = [
    "bash",
    "-c",
    "scripts/invalidate-stale-cache && .venv/bin/jupyter-book build . "
    "--warningiserror --nitpick --keep-going",
]


def timed_make_book(work: Path, command=("make", "--no-print-directory", "book")):
    """Seconds for `make book` in `work`, and the peak RSS of its whole process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        list(command),
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log, _ = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(command)} failed in {work}:\n{log[-3000:]}")
    return seconds, peak


def executed_records(work: Path) -> dict[int, str]:
    cache = get_cache(work / "_build" / ".jupyter_cache")
    return {r.pk: r.uri for r in cache.list_cache_records()}


def edit_one_chapter(work: Path, run: int) -> None:
    path = work / EDITED
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[-1].source += f"\n# bench edit {run}"
    nbformat.write(nb, path)


def compute_floor() -> dict[str, float]:
    use_kernel_startup()  # as the build's kernels do
    seconds = {}
    for path in nbcheck.toc_notebooks():
        start = time.perf_counter()
        nb = nbcheck.execute(path)
        seconds[path.name] = time.perf_counter() - start
        problems = nbcheck.problems_in_executed(nb, path)
        if problems:
            raise SystemExit("bench: a chapter failed:\n" + "\n".join(problems))
    return seconds


def page_weight(html: Path) -> dict:
    pages = {}
    for page in html.rglob("*.html"):
        size = page.stat().st_size
        soup = BeautifulSoup(page.read_text("utf-8"), "html.parser")
        for img in soup.find_all("img"):
            src = img.get("src", "")
            target = (page.parent / src.split("?")[0]) if src and ":" not in src else None
            if target is not None and target.is_file():
                size += target.stat().st_size
        pages[str(page.relative_to(html))] = size
    largest = max(pages, key=pages.get)
    total = sum(f.stat().st_size for f in html.rglob("*") if f.is_file())
    return {"largest_page": largest, "largest_page_bytes": pages[largest], "site_bytes": total}


def spread(values: list[float]) -> dict:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "runs": values,
    }


def main() -> int:
    work = scratch_copy()
    cores = os.cpu_count() or 1
    floors, parallel_floors, cleans, peaks, serials = [], [], [], [], []
    unchanged, edits, reexecuted, identical = [], [], [], []
    per_chapter: dict[str, list[float]] = {}
    for run in range(RUNS):
        print(f"bench: run {run + 1} of {RUNS}", flush=True)
        floor = compute_floor()
        for name, seconds in floor.items():
            per_chapter.setdefault(name, []).append(seconds)
        floors.append(sum(floor.values()))
        parallel_floors.append(max(max(floor.values()), sum(floor.values()) / cores))

        shutil.rmtree(work / "_build", ignore_errors=True)
        seconds, peak = timed_make_book(work)
        cleans.append(seconds)
        peaks.append(peak)
        parallel_html = ROOT / "_build" / "bench-parallel-html"
        shutil.rmtree(parallel_html, ignore_errors=True)
        shutil.copytree(work / "_build" / "html", parallel_html)

        unchanged.append(timed_make_book(work)[0])

        before = executed_records(work)
        edit_one_chapter(work, run)
        edits.append(timed_make_book(work)[0])
        after = executed_records(work)
        reexecuted.append(sorted({uri for pk, uri in after.items() if pk not in before}))
        shutil.copy2(ROOT / EDITED, work / EDITED)  # the serial build builds the same files

        shutil.rmtree(work / "_build", ignore_errors=True)
        serials.append(timed_make_book(work, SERIAL_BOOK)[0])
        differences = compare_builds.tree_differences(parallel_html, work / "_build" / "html")
        identical.append(differences)

    weight = page_weight(work / "_build" / "html")
    floor_median = statistics.median(floors)
    parallel_floor_median = statistics.median(parallel_floors)
    clean_median = statistics.median(cleans)
    longest = max(per_chapter, key=lambda n: statistics.median(per_chapter[n]))

    def chapter_median(name: str) -> float:
        return statistics.median(per_chapter[name])

    dominates = statistics.median(per_chapter[longest]) > floor_median / cores
    results = {
        "runs": RUNS,
        "cores": cores,
        "compute_floor_seconds": spread(floors),
        "parallel_floor_seconds": spread(parallel_floors),
        "compute_floor_per_chapter_seconds": {k: spread(v) for k, v in per_chapter.items()},
        "longest_chapter": longest,
        "longest_chapter_dominates": dominates,
        "clean_build_seconds": spread(cleans),
        "clean_build_peak_memory_bytes": spread(peaks),
        "serial_build_seconds": spread(serials),
        "ratio_clean_to_floor": clean_median / floor_median,
        "ratio_clean_to_parallel_floor": clean_median / parallel_floor_median,
        "ratio_serial_to_floor": statistics.median(serials) / floor_median,
        "serial_build_differences": identical,
        "no_change_rebuild_seconds": spread(unchanged),
        "one_chapter_edit_seconds": spread(edits),
        "one_chapter_edit_reexecuted": [[Path(u).name for u in r] for r in reexecuted],
        **weight,
    }
    serial_target = "clean build <= 0.75 x serial floor" + (
        " (not binding: the longest chapter dominates)" if dominates else ""
    )
    checks = {
        serial_target: results["ratio_clean_to_floor"] <= 0.75,
        "clean build <= 1.3 x parallel floor": results["ratio_clean_to_parallel_floor"] <= 1.3,
        "pages identical to a serial build's": all(d == [] for d in identical),
        "no-change rebuild <= 10 s": statistics.median(unchanged) <= 10,
        "one-chapter edit re-executes one notebook": all(
            [Path(u).name for u in r] == [Path(EDITED).name] for r in reexecuted
        ),
        "largest page <= 1 MB": weight["largest_page_bytes"] <= 1_000_000,
        "build peak memory <= 2 GB": max(peaks) <= 2 * 1024**3,
        # per-chapter budgets set by their issues (25, 28), on each chapter's median
        "chapter 6 executes in <= 30 s": chapter_median("06-simsiam.ipynb") <= 30,
        "Part VI (chapters 12 and 13) executes in <= 60 s": (
            chapter_median("12-ddp.ipynb") + chapter_median("13-compile.ipynb") <= 60
        ),
    }
    # The test suite's last run (tests/conftest.py writes it): its growth shows here.
    test_times = ROOT / "_build" / "test-times.json"
    if test_times.exists():
        suite = json.loads(test_times.read_text())
        results["test_suite"] = suite
        checks["make test <= 480 s"] = suite["wall_seconds"] <= 480
    results["targets"] = {name: ("met" if ok else "MISSED") for name, ok in checks.items()}
    out = ROOT / "_build" / "bench.json"
    out.write_text(json.dumps(results, indent=2))
    print(render(results))
    for run, differences in enumerate(identical, 1):
        if differences:
            print(f"\nrun {run}: the serial build's pages differ:\n" + "\n".join(differences[:10]))
    print(f"\nwritten: {out}")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(ROOT / "_build" / "bench-parallel-html", ignore_errors=True)
    return 0


def test_suite_lines(suite: dict | None) -> list[str]:
    """The last test run's wall time and ten slowest items (none recorded: say so)."""
    if suite is None:
        return ["", "test suite: no run recorded yet (make test writes _build/test-times.json)"]
    lines = [
        "",
        f"test suite (the last make test): {suite['wall_seconds']:.0f} s wall,"
        f" {suite['items']} items, exit status {suite['exit_status']}; slowest:",
    ]
    lines += [f"  {t['seconds']:7.1f} s  {t['test']}" for t in suite["slowest"]]
    return lines


def render(r: dict) -> str:
    def row(label, s, unit="s", scale=1.0):
        return (
            f"| {label} | {s['min'] / scale:.1f} | {s['median'] / scale:.1f} | "
            f"{s['max'] / scale:.1f} | {unit} |"
        )

    lines = [
        "| measure | min | median | max | unit |",
        "|---|---|---|---|---|",
        row("serial floor (sum of chapters)", r["compute_floor_seconds"]),
        row(f"parallel floor ({r['cores']} cores)", r["parallel_floor_seconds"]),
    ]
    for name, s in r["compute_floor_per_chapter_seconds"].items():
        lines.append(row(f"  {name}", s))
    lines += [
        row("clean build (parallel)", r["clean_build_seconds"]),
        row("clean build peak memory", r["clean_build_peak_memory_bytes"], "MiB", 1024**2),
        row("serial build (Jupyter Book alone)", r["serial_build_seconds"]),
        row("no-change rebuild", r["no_change_rebuild_seconds"]),
        row("one-chapter edit", r["one_chapter_edit_seconds"]),
        "",
        f"ratio clean build / serial floor (medians): {r['ratio_clean_to_floor']:.2f}",
        f"ratio clean build / parallel floor (medians): {r['ratio_clean_to_parallel_floor']:.2f}",
        f"ratio serial build / serial floor (medians): {r['ratio_serial_to_floor']:.2f}",
        f"longest chapter: {r['longest_chapter']}"
        f" ({'dominates' if r['longest_chapter_dominates'] else 'does not dominate'})",
        "pages of the serial build against the clean build's: "
        + "; ".join(
            "identical" if not d else f"{len(d)} files differ"
            for d in r["serial_build_differences"]
        ),
        f"re-executed after editing {Path(EDITED).name}: {r['one_chapter_edit_reexecuted']}",
        f"largest page: {r['largest_page']} {r['largest_page_bytes'] / 1024:.0f} KiB;"
        f" whole site {r['site_bytes'] / 1024**2:.1f} MiB",
        *test_suite_lines(r.get("test_suite")),
        "",
        "| target | result |",
        "|---|---|",
        *[f"| {name} | {result} |" for name, result in r["targets"].items()],
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
