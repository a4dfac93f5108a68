"""Every chapter runs top to bottom on a fresh kernel and fails only where it says it will."""

import nbformat
import pytest
from jupyter_cache import get_cache

import nbcheck

ALL_NOTEBOOKS = sorted(
    [*(nbcheck.ROOT / "notebooks").glob("*.ipynb"), *(nbcheck.ROOT / "book").glob("*.ipynb")]
)
# Every notebook of _toc.yml, and any chapter in notebooks/ that _toc.yml forgot.
CHAPTERS = nbcheck.notebooks_to_run()
BUILT = nbcheck.toc_notebooks()


def test_toc_lists_chapters():
    assert CHAPTERS, "_toc.yml lists no notebook"
    for path in CHAPTERS:
        assert path.parent.name in ("notebooks", "book")


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert nbcheck.stored_state_problems(nb, path) == []


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_declarations_are_well_formed(path):
    nb = nbformat.read(path, as_version=4)
    problems = [
        f"{nbcheck.where(path, i, c)}: {p}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for p in nbcheck.declaration_problems(c)
    ]
    assert problems == []


@pytest.fixture(scope="module")
def executed(clone_build):
    """Each chapter as a second, independent clean build executed it (a fresh kernel each)."""
    cache = get_cache(clone_build / "_build" / ".jupyter_cache")
    runs = {}
    for path in CHAPTERS:
        try:
            runs[path] = cache.merge_match_into_notebook(nbformat.read(path, as_version=4))[1]
        except KeyError:
            # Not in the build's cache (a chapter _toc.yml forgot, or one whose own
            # execution settings keep it out): run it here, on its own fresh kernel.
            runs[path] = nbcheck.execute(path)
    return runs


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_runs_with_only_declared_errors(executed, path):
    problems = nbcheck.problems_in_executed(executed[path], path)
    assert not problems, "\n".join(problems)


def build_run(built_book, path):
    """The chapter as the book build executed it, from Jupyter Book's execution cache."""
    cache = get_cache(built_book.parent / ".jupyter_cache")
    _, merged = cache.merge_match_into_notebook(nbformat.read(path, as_version=4))
    return merged


@pytest.mark.parametrize("path", BUILT, ids=lambda p: p.name)
def test_same_outputs_as_the_book_build(executed, built_book, path):
    # Two independent fresh-kernel runs (this one, and the build's) must agree
    # exactly: seeds are set, and graph pictures are byte-stable.
    ours = nbcheck.comparable_outputs(executed[path])
    theirs = nbcheck.comparable_outputs(build_run(built_book, path))
    assert len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a == b, f"{path.name}: code cell {index} printed something else in the build"
    assert any(ours), "no outputs at all: the comparison would prove nothing"
