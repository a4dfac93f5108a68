"""Two clean builds of the same commit give the same pages, byte for byte.

The whole book is built a second time in another folder, from nothing (the
`clone_build` fixture), and every file of the two sites is compared; the only
difference allowed is the date in a chapter's "Verified" stamp, across days.
A small book shows that the comparison fails where it must: a chapter that prints
a raw memory address makes the two builds differ, and the page is flagged.
"""

import re
import shutil
import sys

import pytest

import minibook
import nbcheck

sys.path.insert(0, str(nbcheck.ROOT / "scripts"))
sys.path.insert(0, str(nbcheck.ROOT / "book" / "_ext"))
import build_stamp  # noqa: E402
import compare_builds  # noqa: E402
from stable_outputs import AddressNumbers, join_stream_pieces  # noqa: E402

ROOT = nbcheck.ROOT


@pytest.fixture(scope="module")
def rendered_again(built_book, tmp_path_factory):
    """The main build's executed chapters, rendered into a clean site in another folder.

    The main _build/html may be an incremental build, which keeps what earlier builds
    left behind (pages since removed, old words in the search index); two *clean*
    builds are what must agree. The execution cache is the main build's, so the
    chapters are not run again here: this is one independent run of them, and
    `clone_build` is the other.
    """
    again = nbcheck.clone_copy(tmp_path_factory.mktemp("again"))
    for name in (".jupyter_cache", ".execution-inputs"):
        source, target = built_book.parent / name, again / "_build" / name
        target.parent.mkdir(exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    result = minibook.make_book(again)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "0 executed, " in result.stdout, "the main build's cache was not used"
    return again


def test_two_clean_builds_of_the_book_are_identical(rendered_again, clone_build):
    differences = compare_builds.tree_differences(
        rendered_again / "_build" / "html", clone_build / "_build" / "html"
    )
    assert differences == [], "two builds of the same files differ:\n" + "\n".join(differences[:20])


def test_no_address_temporary_path_or_build_folder_in_any_page(rendered_again, clone_build):
    problems = []
    for build in (rendered_again, clone_build):
        problems += compare_builds.volatile_problems(build / "_build" / "html", [build, ROOT])
    assert problems == [], "\n".join(problems[:20])


def test_the_intro_lists_every_verified_version(built_book):
    # The sentence comes from book/torch-matrix.json (make matrix), never typed.
    expected = build_stamp.verified_with(ROOT).replace("`", "")
    text = nbcheck.built_page(built_book, "book/intro").get_text()
    assert "".join(f"Verified with: {expected}".split()) in "".join(text.split())
    assert f"torch {build_stamp.stamp_values()['torch_version']} (this build)" in expected


# A small book that prints everything that used to vary, and one thing that still does.
VOLATILE = [
    minibook.cell("import os, sys, time, warnings"),
    minibook.cell("print(object())"),
    minibook.cell("warnings.warn('careful')"),
    minibook.cell("import torch\ntorch.ones(1, requires_grad=True).mul(2).grad"),
    minibook.cell("print('left', end=''); sys.stdout.flush(); time.sleep(0.5); print(' right')"),
    minibook.cell("1 / 0", raises=("ZeroDivisionError", "division by zero")),
    minibook.cell("print(os.path.basename(os.getcwd()))"),
]
INJECTED = [minibook.cell("print(hex(id(object())))")]


@pytest.fixture(scope="module")
def two_small_builds(tmp_path_factory):
    builds = []
    for name in ("first", "second"):
        book = minibook.make(
            tmp_path_factory.mktemp(name), {"volatile": VOLATILE, "injected": INJECTED}
        )
        result = minibook.make_book(book)
        assert result.returncode == 0, result.stdout[-5000:]
        builds.append((book, result.stdout))
    return builds


def test_a_page_printing_a_raw_address_is_caught(two_small_builds):
    (first, _), (second, _) = two_small_builds
    html_a, html_b = first / "_build" / "html", second / "_build" / "html"
    differences = compare_builds.tree_differences(html_a, html_b)
    assert any(d.startswith("notebooks/injected.html differs") for d in differences)
    # the address is also a word of the search index; nothing else may differ
    assert all(d.split()[0] in ("notebooks/injected.html", "searchindex.js") for d in differences)
    flagged = compare_builds.volatile_problems(html_a, [first])
    assert any(p.startswith("notebooks/injected.html:") for p in flagged)
    assert all(p.split(":")[0] in ("notebooks/injected.html", "searchindex.js") for p in flagged)
    assert all("memory address" in p for p in flagged)


def test_what_used_to_vary_is_shown_the_same_way_every_time(two_small_builds):
    (first, _), _ = two_small_builds
    page = nbcheck.built_page(first / "_build" / "html", "notebooks/volatile")
    outputs = [o.get_text() for o in page.select("div.cell_output")]
    assert outputs[0].strip() == "<object object at 0x…1>"
    assert outputs[1].strip() == "UserWarning: careful"  # no temporary file, no line
    # torch's warning without the line of torch's C++ source it was raised from
    assert outputs[2].strip().startswith("UserWarning: The .grad attribute of a Tensor")
    assert outputs[2].strip().endswith("for more information.")
    assert outputs[3].strip() == "left right"  # one print, one line, however it arrived
    assert "ZeroDivisionError" in outputs[4]  # declared: the build went on
    assert outputs[5].strip() == "notebooks"  # run from its own folder, as in the build


def test_the_build_executes_nothing_the_parallel_executor_ran(two_small_builds):
    # The executor keys its results exactly as MyST-NB keys its cache: MyST-NB finds
    # every notebook there and executes none itself.
    for _, log in two_small_builds:
        assert "execute-chapters: 2 executed" in log
        assert len(re.findall(r"Using cached notebook", log)) == 2, log[-3000:]
        assert "Executing notebook" not in log


def test_the_stamp_date_is_the_only_difference_allowed(built_book, tmp_path):
    page = built_book / "notebooks" / "01-autograd-graph.html"
    text = page.read_text("utf-8")
    stamp = re.search(r'<p class="verified-stamp">[^<]*</p>', text).group(0)
    for name, new_stamp, allowed in [
        ("other-day", re.sub(r"\d{4}-\d{2}-\d{2}", "1999-01-01", stamp), True),
        ("other-torch", re.sub(r"torch \S+", "torch 0.0.1", stamp), False),
    ]:
        (tmp_path / name / "a").mkdir(parents=True)
        (tmp_path / name / "b").mkdir()
        (tmp_path / name / "a" / "page.html").write_text(text, "utf-8")
        (tmp_path / name / "b" / "page.html").write_text(text.replace(stamp, new_stamp), "utf-8")
        found = compare_builds.tree_differences(tmp_path / name / "a", tmp_path / name / "b")
        assert (found == []) == allowed, (name, found)


def test_addresses_are_numbered_by_first_appearance():
    number = AddressNumbers()
    text = "<A object at 0x7f01aa> <B object at 0x7f02bb> <function f at 0x7f01aa>"
    assert number(text) == "<A object at 0x…1> <B object at 0x…2> <function f at 0x…1>"
    assert number("<weakref at 0x7f02bb; to 'Tensor' at 0x7f03cc>") == (
        "<weakref at 0x…2; to 'Tensor' at 0x…3>"
    )
    assert (
        number("0x7f01aa alone is not an object's repr") == "0x7f01aa alone is not an object's repr"
    )


def test_stream_pieces_are_joined_exactly_as_printed():
    pieces = [
        {"output_type": "stream", "name": "stdout", "text": "tensor([1.])"},
        {"output_type": "stream", "name": "stderr", "text": "UserWarning: w\n"},
        {"output_type": "stream", "name": "stdout", "text": " True\n"},
        {"output_type": "display_data", "data": {"text/plain": "x"}},
    ]
    joined = join_stream_pieces(pieces)
    assert [o.get("text") for o in joined] == ["tensor([1.]) True\n", "UserWarning: w\n", None]
    assert pieces[0]["text"] == "tensor([1.])", "the notebook itself keeps its pieces"
