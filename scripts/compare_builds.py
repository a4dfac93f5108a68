"""Compare two built sites byte for byte; find what must never be in a page.

    python scripts/compare_builds.py BUILD_A/html BUILD_B/html

Two clean builds of the same commit must give identical files. One difference is
allowed: the date in each chapter's "Verified" stamp, which is the day that chapter
ran (two builds made on different days differ there and only there).

``volatile_problems`` looks for what would make two builds differ even when one
build has nothing to compare with: a memory address, a temporary path, an IPython
cell file name, or the absolute path of the folder the book was built in.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

# build_stamp.py writes: <p class="verified-stamp">Verified: ... on 2026-11-30.</p>
STAMP_DATE = re.compile(rb'(<p class="verified-stamp">[^<]* on )\d{4}-\d{2}-\d{2}(\.</p>)')
# What only the runs themselves produce. Inline images are skipped: base64 text can
# spell anything.
VOLATILE = {
    "memory address": re.compile(r"\b0x[0-9a-fA-F]{6,16}\b"),
    "temporary path": re.compile(r"(?<![\w.])/tmp/[\w./-]*"),
    "IPython cell file": re.compile(r"ipykernel_\d+"),
}
DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")
PAGES = {".html", ".js", ".json", ".txt", ".svg", ".ipynb"}


def _normalised(data: bytes) -> bytes:
    return STAMP_DATE.sub(rb"\g<1>YYYY-MM-DD\g<2>", data)


def _files(tree: Path) -> set[Path]:
    return {p.relative_to(tree) for p in tree.rglob("*") if p.is_file()}


def _first_difference(a: bytes, b: bytes) -> str:
    pairs = itertools.zip_longest(a.splitlines(), b.splitlines(), fillvalue=b"")
    for number, (x, y) in enumerate(pairs, 1):
        if x != y:
            differing = (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)
            at = next(differing, min(len(x), len(y)))
            lo = max(0, at - 60)
            return (
                f"line {number}:\n"
                f"    first:  …{x[lo : at + 60].decode('utf-8', 'replace')}…\n"
                f"    second: …{y[lo : at + 60].decode('utf-8', 'replace')}…"
            )
    return "the line endings"


def tree_differences(first: Path, second: Path) -> list[str]:
    """Every file that is in one tree only or differs (stamp dates aside), and where."""
    first, second = Path(first), Path(second)
    files_a, files_b = _files(first), _files(second)
    problems = [f"only in the first build: {p}" for p in sorted(files_a - files_b)]
    problems += [f"only in the second build: {p}" for p in sorted(files_b - files_a)]
    for name in sorted(files_a & files_b):
        a, b = (first / name).read_bytes(), (second / name).read_bytes()
        if a != b and _normalised(a) != _normalised(b):
            problems.append(f"{name} differs at {_first_difference(a, b)}")
    return problems


def volatile_problems(tree: Path, build_folders: list[Path] = ()) -> list[str]:
    """Every address, temporary path or build-folder path written into a page."""
    tree = Path(tree)
    patterns = dict(VOLATILE)
    for folder in build_folders:
        for spelling in {str(folder), str(Path(folder).resolve())}:
            patterns[f"build folder {spelling}"] = re.compile(re.escape(spelling))
    problems = []
    for path in sorted(tree.rglob("*")):
        if not path.is_file() or path.suffix not in PAGES or "_static" in path.parts:
            continue
        text = DATA_URI.sub("data:", path.read_text("utf-8", errors="replace"))
        for what, pattern in patterns.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                context = text[max(0, match.start() - 60) : match.end() + 20]
                problems.append(
                    f"{path.relative_to(tree)}:{line}: {what} {match.group(0)!r} in …{context}…"
                )
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = tree_differences(Path(argv[0]), Path(argv[1]))
    for tree in argv:
        problems += volatile_problems(Path(tree))
    print("\n".join(problems) or "identical, and nothing volatile in any page")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
