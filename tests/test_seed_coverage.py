"""The seed-coverage appendix: each way a post's line can be covered, or missed, is told apart."""

import sys

import nbformat
import pytest

import nbcheck

sys.path.insert(0, str(nbcheck.ROOT / "book"))
import seed_coverage as sc  # noqa: E402

POSTS = sc.load_posts(nbcheck.ROOT / "book" / "seed-posts.yml")


def test_every_example_of_the_design_is_in_the_data():
    examples = {block["example"] for post in POSTS for block in post["blocks"]}
    assert examples == {
        *(f"001-E{n}" for n in range(1, 8)),
        "002-E1", "002-E2", "002-E3",
        "000-E1", "000-E1c", "000-E2", "000-E2b",
    }  # fmt: skip
    assert all(block["sections"] for post in POSTS for block in post["blocks"])


def _notebook(tmp_path, cells):
    path = tmp_path / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_sections_collect_what_their_cells_print(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    fails = code("raise ValueError('on purpose')")
    fails.metadata["expected_error"] = {"type": "ValueError", "message": "on purpose"}
    path = _notebook(
        tmp_path,
        [
            code("%xmode Minimal\nvalue = 1"),
            md("(one)=\n(also-one)=\n## One\n"),
            code("print('first', value)"),
            md("### Inside one\n"),
            fails,
            md("(two)=\n## Two\n"),
            code("print('second')"),
            md("## Not wanted\n"),
            code("raise RuntimeError('never run: the sections are done')"),
        ],
    )
    sections = sc.run_sections(path, {"one", "also-one", "two"})
    assert sections["one"].lines == ["first 1", "ValueError: on purpose"]
    assert sections["also-one"].lines == sections["one"].lines
    assert sections["two"].lines == ["second"] and sections["two"].cells == 1


def test_an_undeclared_error_or_a_missing_label_stops_the_run(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    path = _notebook(tmp_path, [md("(one)=\n## One\n"), code("1 / 0")])
    with pytest.raises(sc.SeedCoverageError, match=r"probe.ipynb, cell 1: ZeroDivisionError"):
        sc.run_sections(path, {"one"})
    path = _notebook(tmp_path, [md("(one)=\n## One\n"), code("x = 1")])
    with pytest.raises(sc.SeedCoverageError, match="no section labelled \\['gone'\\]"):
        sc.run_sections(path, {"one", "gone"})


def test_a_post_runs_as_its_blocks_say():
    post = {
        "post": "x",
        "blocks": [
            {"example": "E1", "sections": [], "code": "n = 1\nprint(n)\n", "printed": []},
            {"example": "E2", "sections": [], "code": "print(n + 1)\n", "printed": [],
             "continues": True},
            {"example": "E3", "sections": [], "code": "print(n)\n", "printed": [],
             "setup": "n = 5\nprint('unseen')\n"},
            {"example": "E4", "sections": [], "code": "n = 7\nprint(object.__repr__(n))\nn.x\n",
             "printed": []},
        ],
    }  # fmt: skip
    today = sc.run_post(post)
    assert today[:3] == [["1"], ["2"], ["5"]]
    assert today[3] == ["<int object at 0x…>", "AttributeError: 'int' object has no attribute 'x'"]


def test_lines_are_paired_in_order_and_errors_by_type():
    post = ["a", "gone", "RuntimeError: one of the", "b"]
    today = ["a", "RuntimeError: one of the variables, in full", "b", "extra"]
    assert sc.align(post, today) == [
        ("a", "a"),
        ("gone", None),
        ("RuntimeError: one of the", "RuntimeError: one of the variables, in full"),
        ("b", "b"),
        (None, "extra"),
    ]


@pytest.mark.parametrize(
    ("post", "today", "book", "status"),
    [
        ("tensor([ 3., 10., 7.])", "tensor([ 3.,  10.,  7.])", ["tensor([ 3., 10.,  7.])"], "same"),
        ("grad_fn=)", "grad_fn=<AddBackward0>)", ["grad_fn=<AddBackward0>)"], "today's line"),
        ("10.", "18.", ["10.", "18."], "both lines"),
        ("None None", None, ["None None"], "the post's line"),
        ("printed by the post", "and today", ["but not by the book"], sc.MISSING),
        (None, "printed today only", [], sc.MISSING),
        ("RuntimeError: cut", "RuntimeError: cut short", ["RuntimeError: cut short"], "same"),
        ("y的梯度(z对y)为： 1", "y的梯度(z对y)为： 1", ["gradient of y (dz/dy): 1"], "same"),
    ],
)
def test_the_book_column_says_which_line_the_book_prints(post, today, book, status):
    translate = {"y的梯度(z对y)为：": "gradient of y (dz/dy):"}
    assert sc.book_status(post, today, book, translate) == status


def test_a_missing_line_shows_as_missing_in_the_table(tmp_path):
    block = {"example": "E1", "sections": ["one"], "code": "print(1)\nprint(2)\n",
             "printed": ["1", "two"]}  # fmt: skip
    sections = {"one": sc.Section("one", tmp_path / "probe.ipynb", "One", ["1"], cells=1)}
    rows = sc.block_rows(block, ["1", "2"], sections)
    assert [row["book"] for row in rows] == ["runs", "same", sc.MISSING]
    table = sc.markdown_table(rows)
    assert "**E1**, code: `print(1)` … (2 lines) | | runs: {ref}`one` |" in table
    assert table.splitlines()[-1] == "| `two` | `2` | **missing** |"
