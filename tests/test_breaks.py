"""Every promise of README's "What the tests check", broken on purpose and seen to fail.

A test that has never failed proves nothing. So this file makes a small copy of the
book, the *probe book*: the repository's configuration, Makefile, scripts and tests,
an introduction (clean: every check passes on it), the error index, and a few pages
and chapters that each carry deliberate breaks. It then runs the suite's own tests on
that copy, in a separate pytest, and checks that each break makes the test that
guards it fail, with a failure that names the break, while the same tests pass on
the clean introduction.

Three rounds share the copy (one build, which takes far less than the whole book):

1. the probe book is built by ``make book`` and the site, notebook and browser tests
   run on it;
2. a broken ``{doc}`` link is added: ``make book`` itself must fail (warnings are
   errors, whatever the Makefile says today);
3. without building (``make`` must not run again: the pins are broken and the copy
   shares the repository's ``.venv``): a table of contents naming a missing file, a
   broken picture helper, wrong pins and a skipped test.

``BREAKS`` below is the table: promise, break, the test that must fail, and what its
failure must say. ``test_breaks_table`` writes it, with this run's failure lines, to
``_build/breaks.md``. ``ELSEWHERE`` lists the breaks other test files apply themselves.
"""

from __future__ import annotations

import ast
import base64
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

import nbcheck

ROOT = nbcheck.ROOT
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
# A declared message that starts like PyTorch's (so the error index finds its
# explanation) but is not what PyTorch says.
REAL_MESSAGE = "element 0 of tensors does not require grad and does not have a grad_fn"
WRONG_MESSAGE = REAL_MESSAGE + " (probe: not what PyTorch says)"
LATE_ERROR = "probe: an error logged 1.5 s after the load event"
# A pin of requirements.txt that none of the book's direct dependencies is: torch needs it.
TRANSITIVE_PIN = "filelock"


@dataclass(frozen=True)
class Break:
    promise: str  # README's words
    done: str  # what the probe book does wrong
    test: str  # file::test[param] that must fail
    says: str  # what its failure message must contain
    round: int = 1


BREAKS = [
    Break(
        "every chapter runs top to bottom on a fresh kernel",
        "notebooks/07-extra.ipynb raises 1 / 0 and is not in _toc.yml",
        "test_notebooks.py::test_runs_with_only_declared_errors[07-extra.ipynb]",
        "unexpected ZeroDivisionError: division by zero",
    ),
    Break(
        "every chapter ... is in the book (_toc.yml)",
        "notebooks/07-extra.ipynb is not in _toc.yml",
        "test_book.py::test_every_chapter_is_in_the_toc",
        "notebooks/07-extra.ipynb",
    ),
    Break(
        "every chapter follows the chapter skeleton",
        "notebooks/07-extra.ipynb has no overview, exercises or summary",
        "test_skeleton.py::test_follows_the_skeleton[07-extra.ipynb]",
        "needs exactly one '## Overview'",
    ),
    Break(
        "its outputs match the book build's own run exactly",
        "notebooks/01-probe prints torch.rand(3) without a seed",
        "test_notebooks.py::test_same_outputs_as_the_book_build[01-probe.ipynb]",
        "printed something else in the build",
    ),
    Break(
        "every cell meant to fail declares the exact type and message",
        "notebooks/01-probe declares a message PyTorch does not print",
        "test_notebooks.py::test_runs_with_only_declared_errors[01-probe.ipynb]",
        "message differs",
    ),
    Break(
        "... and so does a declared cell that no longer fails",
        "notebooks/01-probe declares an error in a cell that raises nothing",
        "test_notebooks.py::test_runs_with_only_declared_errors[01-probe.ipynb]",
        "but the cell raised nothing",
    ),
    Break(
        "the error index shows what the chapters raise",
        "the index is built from 01-probe's wrong declaration",
        "test_appendices.py::test_error_index_shows_the_errors_the_chapters_raise",
        "(probe: not what PyTorch says)",
    ),
    Break(
        "every error a page raises on purpose is in the error index",
        "notebooks/01-probe catches an error on purpose and checks a message the index lacks",
        "test_error_index_complete.py::test_every_error_a_page_shows_is_indexed",
        "shape '[3]' is invalid",
    ),
    Break(
        "every picture's labels at least 10 px as drawn",
        "book/probe-page draws a 1200 px wide graph 150 px wide",
        "test_picture_labels.py::test_picture_labels_are_at_least_10_px[book/probe-page]",
        "labels under 10 px",
    ),
    Break(
        "notebooks are committed without outputs, execution counts or stray metadata",
        "notebooks/02-probe-stale keeps an output, a count and 'mystnb' metadata",
        "test_notebooks.py::test_committed_without_outputs[02-probe-stale.ipynb]",
        "notebook metadata not allowed: ['mystnb']",
    ),
    Break(
        "every chapter keeps its checks folded, off the reader's path",
        "notebooks/01-probe shows an assert on its page",
        "test_page_shape.py::test_chapter_reads_in_fifteen_minutes[notebooks/01-probe]",
        # the count is the probe's: other breaks catch errors with asserts there too
        "visible assert(s) on the reader's path",
    ),
    Break(
        "every image has alt text",
        "book/probe-pictures: {image} without :alt: (Sphinx puts the path), ![](probe.png)",
        "test_book.py::test_every_image_exists_and_has_alt_text",
        "book/probe-pictures: image '../_images/probe.png' has its file name for alt text",
    ),
    Break(
        "every image has alt text (a plot a cell shows)",
        "notebooks/01-probe shows a matplotlib plot with no alt text",
        "test_book.py::test_every_image_exists_and_has_alt_text",
        "notebooks/01-probe: image",
    ),
    Break(
        "tracebacks appear only in cells declared to fail",
        "notebooks/02-probe-stale is not executed and shows a stored error",
        "test_book.py::test_tracebacks_only_in_cells_declared_to_fail",
        "notebooks/02-probe-stale: an error is shown outside a cell declared to fail",
    ),
    Break(
        "browser: no console error",
        "book/probe-pictures logs an error 1.5 s after its load event",
        "test_browser.py::test_page_loads_without_errors[book/probe-pictures]",
        LATE_ERROR,
    ),
    Break(
        "browser: the page reaches no host but the MathJax/Thebe CDN",
        "book/probe-page fetches from example.com",
        "test_browser.py::test_page_loads_without_errors[book/probe-page]",
        "example.com",
    ),
    Break(
        "browser: every image loaded with alt text",
        "book/probe-pictures, as above",
        "test_browser.py::test_images_loaded_with_alt_text[book/probe-pictures]",
        "'../_images/probe.png': has its file name for alt text",
    ),
    Break(
        "browser: errors only in cells declared to fail",
        "notebooks/02-probe-stale, as above",
        "test_browser.py::test_errors_shown_only_in_cells_declared_to_fail"
        "[notebooks/02-probe-stale]",
        "assert 1 == 0",
    ),
    Break(
        "browser: solutions that open on click",
        "notebooks/01-probe's solutions are not dropdowns",
        "test_browser.py::test_solution_opens_on_click",
        "a solution is visible before any click",
    ),
    Break(
        "browser: launch buttons that point where _config.yml says",
        "a Sphinx theme option sends the buttons to another branch",
        "test_browser.py::test_launch_buttons_point_where_the_config_says",
        "/not-the-configured-branch?urlpath=lab/tree/notebooks/01-probe.ipynb'], not",
    ),
    Break(
        "browser: download buttons that point where _config.yml says",
        "html_copy_source: false (a smaller site), so no notebook to download",
        "test_browser.py::test_download_button_serves_the_chapter_notebook",
        "no .ipynb download link",
    ),
    Break(
        "browser: no serious or critical axe-core violation",
        "book/probe-page has text too faint to read",
        "test_browser.py::test_no_serious_accessibility_violations[book/probe-page]",
        "color-contrast",
    ),
    Break(
        "every internal link and anchor resolving (tests/links.py)",
        "book/probe-page links to intro.html#no-such-anchor",
        "test_browser.py::test_every_internal_link_and_anchor_resolves",
        "no-such-anchor",
    ),
    Break(
        "the book builds with warnings as errors",
        "book/intro links {doc}`no-such-page`",
        "make book",
        "unknown document",
        round=2,
    ),
    Break(
        "every page of _toc.yml is there",
        "_toc.yml names book/no-such-page",
        "test_book.py::test_every_toc_file_exists",
        "book/no-such-page",
        round=3,
    ),
    Break(
        "the shared picture helper has its own unit tests",
        "gradstop keeps torchviz's id()-based node names",
        "test_gradstop.py::test_two_renders_are_byte_identical",
        "assert",
        round=3,
    ),
    Break(
        "the pins: every dependency pinned",
        "requirements.txt loses the pin of a dependency of a dependency",
        "test_pins.py::test_every_dependency_of_the_book_is_pinned",
        f"assert ['{TRANSITIVE_PIN}'] == []",
        round=3,
    ),
    Break(
        "the pins: installed as pinned",
        "requirements-dev.txt pins another pytest than the installed one",
        "test_pins.py::test_pins_match_what_is_installed",
        "pytest: pinned 0.0.1",
        round=3,
    ),
    Break(
        "the pins: the same on Binder",
        "binder/requirements.txt pins a package of its own",
        "test_pins.py::test_binder_installs_the_same_pins_with_a_cpu_torch",
        "binder/ pins something of its own",
        round=3,
    ),
    Break(
        "a skipped test counts as a failure",
        "a test that calls pytest.skip()",
        "pytest exit status",
        "FAILED: tests were skipped",
        round=3,
    ),
]

# Promises whose breaks other test files apply to a copy or a fixture of their own.
ELSEWHERE = [
    (
        "every cell meant to fail declares the exact type and message",
        "tests/fixtures/wrong_declarations.ipynb: wrong type, wrong message, undeclared "
        "error, declared cell that raises nothing, tag without declaration and back",
        "test_nbcheck.py::test_checker_flags_every_wrong_cell_and_only_those",
    ),
    (
        "any other error fails (the build too)",
        "a one-chapter copy whose chapter raises ZeroDivisionError",
        "test_book.py::test_unexpected_error_fails_the_build_naming_notebook_and_cell",
    ),
    (
        "notebooks are committed without outputs (make lint)",
        "notebooks/99-dirty.ipynb with an output, in a copy",
        "test_lint.py::test_lint_fails_on_a_notebook_with_outputs",
    ),
    (
        "every internal link and anchor resolving (tests/links.py)",
        "a hand-made site with a missing page and a missing anchor",
        "test_browser.py::test_link_check_catches_a_broken_link_and_a_broken_anchor",
    ),
    (
        "the browser tests fail, never skip, without Chromium",
        "a PATH without chromium: scripts/setup-env, which make test runs first, stops",
        "test_setup_env.py::test_missing_chromium_for_the_tests_stops_with_one_clear_line",
    ),
    (
        "the pins: torch as its CPU build (a CUDA or ROCm build of the same version fails)",
        "torch's metadata faked as PyPI's CUDA wheel, a +cu126 and a +rocm6.4 build",
        "test_pins.py::test_a_gpu_build_of_the_pinned_torch_fails_the_pin_checks",
    ),
    (
        "the pins: the whole set resolves on the oldest Python 3.11",
        "the pins that rejected Python 3.11.2 put back",
        "test_pins.py::test_the_resolve_check_fails_on_the_pins_that_rejected_3_11_2",
    ),
    (
        "the pins: nothing yanked",
        "a set with soupsieve 3.0.1, a yanked release",
        "test_pins.py::test_the_resolve_check_fails_on_a_yanked_pin",
    ),
    (
        "the set-up: one clear line when Graphviz is missing",
        "a PATH without dot",
        "test_setup_env.py::test_missing_graphviz_as_user_stops_with_one_clear_line",
    ),
    (
        "the set-up: one clear line when the venv module is missing",
        "a Python whose ensurepip fails to import",
        "test_setup_env.py::test_a_python_without_its_venv_module_stops_with_one_clear_line",
    ),
    (
        "the set-up: one clear line when a pin rejects this Python",
        "soupsieve 4.1.3 (needs 3.11.5) on Debian's 3.11.2",
        "test_setup_env.py::test_a_pin_that_rejects_this_python_stops_with_one_line",
    ),
    (
        "the set-up: torch from PyTorch's CPU index when it answers",
        "setup-env's use of the CPU index broken (a stand-in index on 127.0.0.1)",
        "test_setup_env.py::test_the_cpu_index_check_fails_when_the_index_is_never_used",
    ),
    (
        "the set-up: else the default index after one probe",
        "pip handed the silent index instead of one probe",
        "test_setup_env.py::test_the_hanging_index_check_fails_when_pip_is_handed_the_index",
    ),
    (
        "with the network down: every formula typeset by the site's own MathJax",
        "a copy of chapter 1 loading MathJax from the CDN again",
        "test_offline.py::test_offline_check_catches_mathjax_from_a_cdn",
    ),
    (
        "live code: chapter 1's cells run on a kernel, their output printed by it",
        "chapter 1 as published: its Thebe asks Binder for the kernel (out of reach)",
        "test_livecode.py::test_live_code_check_fails_without_a_kernel",
    ),
    (
        "make pdf: each chapter on its own page under its title, every page numbered",
        "the PDF's pages with chapter 3's first three taken out",
        "test_pdf.py::test_pdf_check_catches_a_missing_chapter",
    ),
    (
        "make pdf: each chapter's asserted output in its pages; contents' page numbers right",
        "chapter 1's output blanked out of the PDF's text; chapter 2 one page off in the contents",
        "test_pdf.py::test_pdf_check_catches_a_missing_output_and_a_wrong_contents",
    ),
    (
        "make pdf: every picture vector",
        "a one-page PDF holding a bitmap",
        "test_pdf.py::test_bitmap_count_sees_a_picture_printed_as_a_bitmap",
    ),
    (
        "dark mode: no serious colour-contrast violation, pictures dark on a light ground",
        "in dark mode, pictures inverted and dimmed and paragraphs greyed",
        "test_darkmode.py::test_dark_mode_checks_catch_dim_pictures_and_faint_text",
    ),
]

# The tests of round 1 that must pass on the probe book's clean pages (the introduction
# shows a picture with alt text): the breaks, not the copy, make the others fail.
CLEAN = [
    "test_browser.py::test_page_loads_without_errors[book/intro]",
    "test_browser.py::test_images_loaded_with_alt_text[book/intro]",
    "test_browser.py::test_no_serious_accessibility_violations[book/intro]",
    "test_browser.py::test_errors_shown_only_in_cells_declared_to_fail[notebooks/01-probe]",
    "test_browser.py::test_every_page_has_its_screenshot_and_axe_results",
    "test_book.py::test_every_toc_page_is_built",
    "test_book.py::test_every_toc_file_exists",
    "test_notebooks.py::test_committed_without_outputs[01-probe.ipynb]",
    "test_error_index_complete.py::test_shown_in_links_every_section_that_shows_it",
    "test_error_index_complete.py::test_section_titles_are_unique_within_each_page",
    "test_picture_labels.py::test_picture_labels_are_at_least_10_px[book/intro]",
]


# --- the probe book ---------------------------------------------------------------


def png(width: int = 8, height: int = 8) -> bytes:
    """A small red PNG, written by hand (no image library needed)."""
    rows = b"".join(b"\x00" + b"\xd0\x20\x20" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def declared(source: str, message: str):
    metadata = {
        "tags": ["raises-exception"],
        "expected_error": {"type": "RuntimeError", "message": message},
    }
    return new_code_cell(source, metadata=metadata)


def probe_chapter():
    exercises = "\n\n".join(
        f":::{{exercise}}\n:label: probe-ex-{n}\n\nWhat is {n} + {n}?\n:::\n\n"
        f"::::{{solution}} probe-ex-{n}\n\n{2 * n}.\n::::"  # no ":class: dropdown"
        for n in (1, 2, 3)
    )
    return new_notebook(
        cells=[
            new_markdown_cell("# Probe chapter\n\nDeliberate breaks; each must fail a test."),
            new_code_cell("import torch"),
            new_markdown_cell("## A check left on the reader's path"),
            new_code_cell("assert torch.ones(1).item() == 1.0"),
            new_markdown_cell("## A declared error with the wrong message"),
            declared("torch.zeros(1).sum().backward()", WRONG_MESSAGE),
            new_markdown_cell("## A declared error that no longer happens"),
            declared("torch.ones(1, requires_grad=True).sum().backward()", REAL_MESSAGE),
            new_markdown_cell("## An error caught on purpose that the index lacks"),
            new_code_cell(
                "try:\n    torch.ones(2).view(3)\nexcept RuntimeError as err:\n"
                "    assert str(err).startswith(\"shape '[3]' is invalid\")"
            ),
            new_markdown_cell("## A result that is not seeded"),
            new_code_cell("print(torch.rand(3))"),
            new_markdown_cell("## A plot shown without alt text"),
            new_code_cell(
                "import matplotlib.pyplot as plt\n\nplt.plot([0, 1], [1, 0])\nplt.show()"
            ),
            new_markdown_cell("## Exercises\n\n" + exercises),
        ],
        metadata={"kernelspec": KERNELSPEC},
    )


def stale_chapter():
    cell = new_code_cell("1 / 0", execution_count=1)
    cell.outputs = [
        new_output(
            "error",
            ename="ZeroDivisionError",
            evalue="division by zero",
            traceback=["ZeroDivisionError: division by zero"],
        )
    ]
    return new_notebook(
        cells=[new_markdown_cell("# Probe: a chapter shown with stored outputs"), cell],
        metadata={"kernelspec": KERNELSPEC, "mystnb": {"execution_mode": "off"}},
    )


def extra_chapter():
    return new_notebook(
        cells=[new_markdown_cell("# An extra chapter nobody listed"), new_code_cell("1 / 0")],
        metadata={"kernelspec": KERNELSPEC},
    )


# A graph as Graphviz draws one, 900 pt (1200 px) wide with 14-point labels.
WIDE_GRAPH = base64.b64encode(
    b'<svg xmlns="http://www.w3.org/2000/svg" width="900pt" height="60pt" '
    b'viewBox="0 0 900 60"><rect width="900" height="60" fill="white"/>'
    b'<text x="20" y="30" font-size="14.00">AddBackward0</text></svg>'
).decode()
PAGES = {
    "book/intro.md": (
        "# Probe book\n\nThe clean page: every check passes here.\n\n"
        "```{image} probe.png\n:alt: A small red square.\n```\n"
    ),
    "book/probe-pictures.md": (
        "# Probe: pictures without alt text, and a late console error\n\n"
        "```{image} probe.png\n```\n\n![](probe.png)\n\n"
        f'<script>setTimeout(() => console.error("{LATE_ERROR}"), 1500);</script>\n'
    ),
    "book/probe-page.md": (
        "# Probe: faint text, a missing anchor, another host\n\n"
        '<p style="color: #f2f2f2">This sentence is almost invisible.</p>\n\n'
        '<p><a href="intro.html#no-such-anchor">A link to an anchor that is not there</a></p>\n\n'
        '<script>fetch("https://example.com/probe.json", {mode: "no-cors"})'
        ".catch(() => {});</script>\n\n"
        '<p><img alt="A wide graph squeezed into a narrow panel." style="width: 150px" '
        f'src="data:image/svg+xml;base64,{WIDE_GRAPH}"></p>\n'
    ),
}
TOC = [
    "notebooks/01-probe",
    "notebooks/02-probe-stale",
    "book/errors",
    "book/probe-pictures",
    "book/probe-page",
]


def make_probe_book(dest: Path) -> Path:
    names = ["Makefile", "_config.yml", "pytest.ini", "scripts", "tests", "binder"]
    names += [p.name for p in ROOT.glob("requirements*.txt")]
    names += [name for name in ("src", "pyproject.toml") if (ROOT / name).exists()]
    nbcheck.repo_copy(dest, names)
    (dest / "book").mkdir()
    shutil.copytree(ROOT / "book" / "_ext", dest / "book" / "_ext")
    shutil.copytree(ROOT / "book" / "_static", dest / "book" / "_static")
    shutil.copy(ROOT / "book" / "references.bib", dest / "book" / "references.bib")
    # The index's links into the book's chapters point at pages the probe does not have.
    errors = (ROOT / "book" / "errors.md").read_text("utf-8").splitlines(keepends=True)
    (dest / "book" / "errors.md").write_text(
        "".join(line for line in errors if not re.search(r"\{(ref|doc)\}`", line)), "utf-8"
    )
    # The proofs are the book's chapter sections, which the probe book does not have.
    explanations = yaml.safe_load((ROOT / "book" / "error-explanations.yml").read_text("utf-8"))
    for entry in explanations.values():
        entry.pop("proof", None)
    (dest / "book" / "error-explanations.yml").write_text(
        yaml.safe_dump(explanations, allow_unicode=True, sort_keys=False), "utf-8"
    )
    (dest / "notebooks").mkdir()
    for helper in (ROOT / "notebooks").glob("*.py"):
        shutil.copy(helper, dest / "notebooks" / helper.name)
    for name, text in PAGES.items():
        (dest / name).write_text(text, encoding="utf-8")
    (dest / "book" / "probe.png").write_bytes(png())
    nbformat.write(probe_chapter(), dest / "notebooks" / "01-probe.ipynb")
    nbformat.write(stale_chapter(), dest / "notebooks" / "02-probe-stale.ipynb")
    # A git work tree, as a clone is: the clean-build fixture copies what git lists.
    shutil.copy(ROOT / ".gitignore", dest / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    nbformat.write(extra_chapter(), dest / "notebooks" / "07-extra.ipynb")
    toc = {"format": "jb-book", "root": "book/intro", "chapters": [{"file": f} for f in TOC]}
    (dest / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    # A theme option that overrides the repository's branch behind _config.yml's back.
    config = yaml.safe_load((dest / "_config.yml").read_text("utf-8"))
    options = config["sphinx"]["config"].setdefault("html_theme_options", {})
    options["repository_branch"] = "not-the-configured-branch"
    # And the page sources, which the download button serves, left out of the site.
    config["sphinx"]["config"]["html_copy_source"] = False
    (dest / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
    return dest


# --- running the suite on it ------------------------------------------------------


def run_pytest(repo: Path, tests: list[str], deselect: list[str] = ()):
    """The copy's own tests, in a pytest of their own; outcomes by 'file::name'."""
    report = repo / f"results-{len(list(repo.glob('results-*.xml')))}.xml"
    args = [f"tests/{test}" for test in tests]
    args += [arg for test in deselect for arg in ("--deselect", f"tests/{test}")]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *args],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname').split('.')[-1]}.py::{case.get('name')}"
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = "failed" if kind == "failure" else kind
                text = f"{found.get('message', '')}\n{found.text or ''}"
                break
        outcomes[key] = (outcome, text)
    return result, outcomes


# Round 1 runs these whole files, but for two tests that build or run something
# else of their own (slow, and not about the probe book).
ROUND_1 = ["test_book.py", "test_notebooks.py", "test_skeleton.py", "test_appendices.py"]
ROUND_1 += ["test_browser.py", "test_page_shape.py"]
ROUND_1 += ["test_error_index_complete.py", "test_picture_labels.py"]
NOT_IN_ROUND_1 = [
    "test_book.py::test_unexpected_error_fails_the_build_naming_notebook_and_cell",
    "test_skeleton.py::test_template_runs_clean",
    "test_browser.py::test_link_check_catches_a_broken_link_and_a_broken_anchor",
]


def break_round_3(repo: Path) -> None:
    """The breaks that need no build: toc, helper, pins, a skipped test."""
    toc = yaml.safe_load((repo / "_toc.yml").read_text("utf-8"))
    toc["chapters"].append({"file": "book/no-such-page"})
    (repo / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False), "utf-8")

    helper = repo / "src" / "gradstop" / "pictures.py"
    replace(helper, "    stable.body = body\n", "    stable.body = dot.body\n")

    requirements = repo / "requirements.txt"
    pin = next(
        line for line in requirements.read_text().splitlines() if line.startswith(TRANSITIVE_PIN)
    )
    replace(requirements, pin + "\n", "")
    dev = repo / "requirements-dev.txt"
    pin = next(line for line in dev.read_text().splitlines() if line.startswith("pytest=="))
    replace(dev, pin, "pytest==0.0.1")
    binder = repo / "binder" / "requirements.txt"
    binder.write_text(binder.read_text() + "\nsix==1.17.0\n")

    (repo / "tests" / "test_probe_skip.py").write_text(
        "import pytest\n\n\ndef test_skipped():\n    pytest.skip('probe')\n"
    )


ROUND_3 = [
    "test_book.py::test_every_toc_file_exists",
    "test_gradstop.py::test_two_renders_are_byte_identical",
    "test_pins.py::test_every_dependency_of_the_book_is_pinned",
    "test_pins.py::test_pins_match_what_is_installed",
    "test_pins.py::test_binder_installs_the_same_pins_with_a_cpu_torch",
]


def replace(path: Path, old: str, new: str) -> None:
    text = path.read_text("utf-8")
    assert old in text, f"{path.name} no longer contains {old!r}: update this break"
    path.write_text(text.replace(old, new), "utf-8")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The outcome of every test in every round: {round: {'file::test': (outcome, text)}}."""
    repo = make_probe_book(tmp_path_factory.mktemp("probe-book"))
    rounds = {}

    # Round 1: build the probe book; the site, notebook and browser tests on it.
    result, rounds[1] = run_pytest(repo, ROUND_1, deselect=NOT_IN_ROUND_1)
    assert (repo / "_build" / "html" / "index.html").exists(), (
        f"the probe book did not build:\n{result.stdout[-6000:]}"
    )

    # Round 2: a broken {doc} link must stop `make book` itself.
    replace(repo / "book" / "intro.md", "passes here.", "passes here, but {doc}`no-such-page`.")
    build = subprocess.run(
        ["make", "--no-print-directory", "book"], cwd=repo, capture_output=True, text=True
    )
    log = build.stdout + build.stderr
    rounds[2] = {"make book": ("failed" if build.returncode else "passed", log)}

    # Round 3, without building: toc, helper, pins, a skipped test.
    break_round_3(repo)
    _, rounds[3] = run_pytest(repo, ROUND_3)
    # The skip on its own: the run must fail although no test did.
    result, _ = run_pytest(repo, ["test_probe_skip.py"])
    rounds[3]["pytest exit status"] = (
        "failed" if result.returncode else "passed",
        result.stdout[-3000:],
    )
    return rounds


@pytest.mark.parametrize("case", BREAKS, ids=lambda b: f"{b.round}:{b.test}:{b.done[:30]}")
def test_break_is_caught(probe, case):
    outcome, text = probe[case.round].get(case.test, ("did not run", ""))
    assert outcome in ("failed", "error"), f"{case.done}: {case.test} {outcome}"
    assert case.says in text, f"{case.test} failed, but not on the break:\n{text[:3000]}"


@pytest.mark.parametrize("test", CLEAN)
def test_clean_pages_pass(probe, test):
    outcome, text = probe[1].get(test, ("did not run", ""))
    assert outcome == "passed", text[:3000]


# A broken address on the introduction, other than its download button's.
LINK_ON_THE_INTRO = re.compile(r"book/intro\.html: (?!\.\./_sources/)\S+")


@pytest.mark.parametrize(
    "test",
    [
        "test_book.py::test_every_image_exists_and_has_alt_text",
        "test_book.py::test_tracebacks_only_in_cells_declared_to_fail",
        "test_browser.py::test_every_internal_link_and_anchor_resolves",
    ],
)
def test_failures_do_not_name_the_clean_page(probe, test):
    # The introduction shows a picture with alt text and links only to what exists.
    text = probe[1][test][1]
    assert "book/intro:" not in text
    # The link check prints one "page: address: problem" line per broken address, and
    # under CI pytest repeats them in a full diff. The probe's left-out page sources
    # break every page's download button (../_sources/), the introduction's too; any
    # other broken address on the introduction names it wrongly. (The probe page's own
    # broken anchor points *at* the introduction: "... on book/intro.html".)
    assert LINK_ON_THE_INTRO.findall(text) == []


def test_clean_page_check_reads_the_link_message_as_ci_prints_it():
    sources = "book/intro.html: ../_sources/: no such file"
    aimed_at = "book/probe-page.html: intro.html#x: no anchor #x on book/intro.html"
    own = "book/intro.html: probe-page.html#gone: no anchor #gone on book/probe-page.html"
    for message in (f"E  {sources}\nE  {aimed_at}", f"'{sources}',\n'{aimed_at}',"):
        assert LINK_ON_THE_INTRO.findall(message) == []
    assert LINK_ON_THE_INTRO.findall(f"'{own}',") == ["book/intro.html: probe-page.html#gone:"]


def test_breaks_table(probe):
    """The table of promises, breaks and failure lines as this run saw them."""
    rows = ["| promise | break | failing test | failure line |", "|---|---|---|---|"]
    for case in BREAKS:
        outcome, text = probe[case.round].get(case.test, ("did not run", ""))
        line = failure_line(text, case.says).replace("|", "\\|")
        rows.append(f"| {case.promise} | {case.done} | `{case.test}` | {outcome}: `{line}` |")
    rows += [
        f"| {promise} | {done} | `{test}` | (its own fixture) |"
        for promise, done, test in ELSEWHERE
    ]
    table = ROOT / "_build" / "breaks.md"
    table.parent.mkdir(exist_ok=True)
    table.write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert len(rows) == 2 + len(BREAKS) + len(ELSEWHERE)


@pytest.mark.parametrize("promise, done, test", ELSEWHERE, ids=lambda x: str(x)[:40])
def test_breaks_kept_elsewhere_exist(promise, done, test):
    # Breaks that other test files apply themselves: the test named must exist.
    path, name = test.split("::")
    tree = ast.parse((ROOT / "tests" / path).read_text("utf-8"))
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert name in names, f"{test} is gone: update ELSEWHERE in {Path(__file__).name}"


def failure_line(text: str, says: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Sphinx colours its warnings
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if says in line), lines[0] if lines else "")[:160]
