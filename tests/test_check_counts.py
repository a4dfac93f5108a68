"""No chapter loses a check without saying why.

Every page's checks run on every build (tests/test_notebooks.py). This test counts
them — each ``assert`` statement and each call of an ``assert_*`` function
(``torch.testing.assert_close``) in the code cells of every page the book builds — and
compares the counts with ``tests/check_counts.json``. A page with fewer checks than
recorded fails until the file records the new count with the reason, in the same
commit:

    .venv/bin/python tests/test_check_counts.py --update "why the count went down"

A page that was split or merged may move its checks elsewhere; the book's total must
still not go down.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import nbcheck  # noqa: E402

COUNTS = ROOT / "tests" / "check_counts.json"
MAGIC = re.compile(r"^\s*[%!].*$", re.M)


def checks_in(source: str) -> int:
    """Assert statements and assert_*() calls in one cell's code (magics left out)."""
    tree = ast.parse(MAGIC.sub("", source))
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            count += 1
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            count += name.startswith("assert_")
    return count


def counts() -> dict[str, int]:
    """Checks per page of the book, by the page's path."""
    found = {}
    for path in nbcheck.toc_notebooks():
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        found[str(path.relative_to(ROOT))] = sum(checks_in(source) for source in code)
    return found


def recorded() -> dict:
    return json.loads(COUNTS.read_text("utf-8"))


def test_no_page_lost_a_check_without_a_reason():
    now, before = counts(), recorded()["counts"]
    print("\n".join(f"{page}: {before.get(page, '-')} -> {n}" for page, n in now.items()))
    lost = {page: (n, now[page]) for page, n in before.items() if page in now and now[page] < n}
    assert lost == {}, (
        f"checks went down {lost}: record the new counts with the reason "
        "(python tests/test_check_counts.py --update 'why')"
    )


def test_the_book_did_not_lose_checks_overall():
    now, before = counts(), recorded()["counts"]
    assert sum(now.values()) >= sum(before.values())


def test_the_count_sees_every_kind_of_check():
    source = "assert a\ntorch.testing.assert_close(b, c)\n%timeit x\nif d:\n    assert e, 'f'"
    assert checks_in(source) == 3


def update(reason: str) -> None:
    data = recorded() if COUNTS.exists() else {"counts": {}, "history": []}
    now = counts()
    lower = {p: (n, now.get(p, 0)) for p, n in data["counts"].items() if now.get(p, 0) < n}
    if lower:
        data["history"].append({"lower": {p: list(v) for p, v in lower.items()}, "why": reason})
    data["counts"] = now
    COUNTS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--update":
        sys.exit("usage: python tests/test_check_counts.py --update 'why the counts changed'")
    update(sys.argv[2])
