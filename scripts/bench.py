"""`make bench`: how fast the book builds, against the chapters' own compute.

Measured in a scratch copy of the repository (under _build/bench-work/, sharing
.venv), so your own _build/ and working tree are left alone:

- compute floor: each chapter executed on its own, on a fresh kernel (nbclient);
- clean build: `make book` from an empty _build/ and execution cache, with the peak
  memory of the whole process tree (make, Sphinx, the kernels), sampled;
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

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
EDITED = "notebooks/02-detach.ipynb"


def scratch_copy() -> Path:
    work = ROOT / "_build" / "bench-work"
    shutil.rmtree(work, ignore_errors=True)
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


def timed_make_book(work: Path) -> tuple[float, int]:
    """Seconds for `make book` in `work`, and the peak RSS of its whole process tree."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "book"],
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
        raise SystemExit(f"bench: make book failed in {work}:\n{log[-3000:]}")
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
    floors, cleans, peaks, unchanged, edits, reexecuted = [], [], [], [], [], []
    per_chapter: dict[str, list[float]] = {}
    for run in range(RUNS):
        print(f"bench: run {run + 1} of {RUNS}", flush=True)
        floor = compute_floor()
        for name, seconds in floor.items():
            per_chapter.setdefault(name, []).append(seconds)
        floors.append(sum(floor.values()))

        shutil.rmtree(work / "_build", ignore_errors=True)
        seconds, peak = timed_make_book(work)
        cleans.append(seconds)
        peaks.append(peak)

        unchanged.append(timed_make_book(work)[0])

        before = executed_records(work)
        edit_one_chapter(work, run)
        edits.append(timed_make_book(work)[0])
        after = executed_records(work)
        reexecuted.append(sorted({uri for pk, uri in after.items() if pk not in before}))

    weight = page_weight(work / "_build" / "html")
    floor_median = statistics.median(floors)
    clean_median = statistics.median(cleans)
    results = {
        "runs": RUNS,
        "compute_floor_seconds": spread(floors),
        "compute_floor_per_chapter_seconds": {k: spread(v) for k, v in per_chapter.items()},
        "clean_build_seconds": spread(cleans),
        "clean_build_peak_memory_bytes": spread(peaks),
        "ratio_clean_to_floor": clean_median / floor_median,
        "no_change_rebuild_seconds": spread(unchanged),
        "one_chapter_edit_seconds": spread(edits),
        "one_chapter_edit_reexecuted": [[Path(u).name for u in r] for r in reexecuted],
        **weight,
    }
    checks = {
        "clean build <= 1.3 x compute floor + 20 s": clean_median <= 1.3 * floor_median + 20,
        "no-change rebuild <= 10 s": statistics.median(unchanged) <= 10,
        "one-chapter edit re-executes one notebook": all(
            [Path(u).name for u in r] == [Path(EDITED).name] for r in reexecuted
        ),
        "largest page <= 1 MB": weight["largest_page_bytes"] <= 1_000_000,
        "build peak memory <= 2 GB": max(peaks) <= 2 * 1024**3,
    }
    results["targets"] = {name: ("met" if ok else "MISSED") for name, ok in checks.items()}
    out = ROOT / "_build" / "bench.json"
    out.write_text(json.dumps(results, indent=2))
    print(render(results))
    print(f"\nwritten: {out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def render(r: dict) -> str:
    def row(label, s, unit="s", scale=1.0):
        return (
            f"| {label} | {s['min'] / scale:.1f} | {s['median'] / scale:.1f} | "
            f"{s['max'] / scale:.1f} | {unit} |"
        )

    lines = [
        "| measure | min | median | max | unit |",
        "|---|---|---|---|---|",
        row("compute floor (all chapters)", r["compute_floor_seconds"]),
    ]
    for name, s in r["compute_floor_per_chapter_seconds"].items():
        lines.append(row(f"  {name}", s))
    lines += [
        row("clean build", r["clean_build_seconds"]),
        row("clean build peak memory", r["clean_build_peak_memory_bytes"], "MiB", 1024**2),
        row("no-change rebuild", r["no_change_rebuild_seconds"]),
        row("one-chapter edit", r["one_chapter_edit_seconds"]),
        "",
        f"ratio clean build / compute floor (medians): {r['ratio_clean_to_floor']:.2f}",
        f"re-executed after editing {Path(EDITED).name}: {r['one_chapter_edit_reexecuted']}",
        f"largest page: {r['largest_page']} {r['largest_page_bytes'] / 1024:.0f} KiB;"
        f" whole site {r['site_bytes'] / 1024**2:.1f} MiB",
        "",
        "| target | result |",
        "|---|---|",
        *[f"| {name} | {result} |" for name, result in r["targets"].items()],
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
