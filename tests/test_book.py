"""The built site: every page there, every image with alt text, errors only where declared."""

import re
import shutil
import subprocess

import torch
from alt_text import alt_problem

import nbcheck

ROOT = nbcheck.ROOT


def test_every_toc_page_is_built(built_book):
    assert (built_book / "index.html").exists()
    missing = [doc for doc in nbcheck.toc_files() if not (built_book / f"{doc}.html").exists()]
    assert missing == []


def test_every_toc_file_exists():
    # A toc entry without a source file would be a page the reader cannot reach.
    missing = [
        doc
        for doc in nbcheck.toc_files()
        if not any((ROOT / f"{doc}{suffix}").exists() for suffix in (".md", ".ipynb"))
    ]
    assert missing == [], "_toc.yml names files that do not exist"


def test_every_chapter_is_in_the_toc():
    # Only files in _toc.yml are built, so a chapter missing from it would silently
    # vanish from the book (the notebook tests still run it, see nbcheck.chapters).
    listed = set(nbcheck.toc_files())
    left_out = [
        str(path.relative_to(ROOT))
        for path in [*nbcheck.chapter_notebooks(), *sorted((ROOT / "book").glob("*.*"))]
        if path.suffix in (".ipynb", ".md")
        and str(path.relative_to(ROOT).with_suffix("")) not in listed
    ]
    assert left_out == [], "pages of the book that _toc.yml does not list"


def test_every_image_exists_and_has_alt_text(built_book):
    problems, seen = [], 0
    for doc in nbcheck.toc_files():
        for img in nbcheck.built_page(built_book, doc).find_all("img"):
            seen += 1
            src = img.get("src", "")
            bad_alt = alt_problem(src, img.get("alt"))
            if bad_alt:
                problems.append(f"{doc}: image {src[:60]!r} {bad_alt}")
            if not src.startswith("data:") and not (built_book / doc).parent.joinpath(src).exists():
                problems.append(f"{doc}: image {src!r} does not exist")
    assert seen > 0, "no images found at all: the graph pictures are missing"
    assert problems == [], "\n".join(problems)


def test_chapter_one_shows_a_torchviz_graph(built_book):
    soup = nbcheck.built_page(built_book, "notebooks/01-autograd-graph")
    graphs = soup.select("figure.gradient-graph img[src^='data:image/svg+xml']")
    assert graphs, "chapter 1 shows no graph picture"
    assert all(g["alt"].strip() for g in graphs)
    assert soup.select("figure.gradient-graph figcaption")


def test_tracebacks_only_in_cells_declared_to_fail(built_book):
    for doc in nbcheck.toc_files():
        soup = nbcheck.built_page(built_book, doc)
        for trace in soup.select("div.output.traceback"):
            cell = trace.find_parent("div", class_="cell")
            declared = cell is not None and "tag_raises-exception" in cell["class"]
            assert declared, (
                f"{doc}: an error is shown outside a cell declared to fail:\n"
                f"{trace.get_text()[:300]}"
            )


def test_declared_failures_show_their_traceback(built_book):
    for path in nbcheck.toc_notebooks():
        nb = nbcheck.nbformat.read(path, as_version=4)
        declared = sum("expected_error" in c.metadata for c in nb.cells)
        shown = nbcheck.built_page(built_book, path).select(
            "div.cell.tag_raises-exception div.output.traceback"
        )
        assert len(shown) == declared, path.name


def test_no_page_shows_a_local_path(built_book):
    # A full traceback names files of the machine that built the book; %xmode Minimal
    # keeps a declared failure down to its message.
    for doc in nbcheck.toc_files():
        text = nbcheck.built_page(built_book, doc).select_one("article").get_text()
        for path in (str(ROOT), "site-packages"):
            assert path not in text, f"{doc} shows a path of the build machine: {path}"


def test_intro_states_the_torch_it_was_built_with(built_book):
    text = nbcheck.built_page(built_book, "book/intro").get_text(" ")
    version = torch.__version__.split("+")[0]
    assert re.search(rf"torch\s+{re.escape(version)}\b", text), (
        "intro does not name the build's torch"
    )


def test_unexpected_error_fails_the_build_naming_notebook_and_cell(tmp_path):
    # A one-chapter book with this repository's configuration and a chapter that fails.
    nbcheck.repo_copy(
        tmp_path,
        [
            "_config.yml",
            "pyproject.toml",
            "Makefile",
            "requirements.txt",
            "requirements-dev.txt",
            "requirements-lab.txt",
            "scripts",
        ],
    )
    # Everything _config.yml names, so that the chapter's error is the build's only problem.
    shutil.copytree(ROOT / "book" / "_ext", tmp_path / "book" / "_ext")
    shutil.copytree(ROOT / "book" / "_static", tmp_path / "book" / "_static")
    shutil.copy(ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    (tmp_path / "book" / "intro.md").write_text("# Intro\n", encoding="utf-8")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/broken\n",
        encoding="utf-8",
    )
    (tmp_path / "notebooks").mkdir()
    nb = nbcheck.nbformat.v4.new_notebook(
        cells=[
            nbcheck.nbformat.v4.new_markdown_cell("# Broken"),
            nbcheck.nbformat.v4.new_code_cell("x = 1"),
            nbcheck.nbformat.v4.new_code_cell("raise ZeroDivisionError('boom in the second cell')"),
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbcheck.nbformat.write(nb, tmp_path / "notebooks" / "broken.ipynb")
    result = subprocess.run(
        ["make", "--no-print-directory", "book"], cwd=tmp_path, capture_output=True, text=True
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0, "a chapter raising an undeclared error still built"
    assert "broken" in log and "boom in the second cell" in log
    assert "ZeroDivisionError" in log


def test_no_substitution_is_left_unfilled(built_book):
    for doc in nbcheck.toc_files():
        text = nbcheck.built_page(built_book, doc).select_one("article").get_text()
        assert "{{" not in text, f"{doc} shows an unfilled {{{{ substitution }}}}"
