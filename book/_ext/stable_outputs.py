"""Sphinx extension: two builds of the same commit give the same pages, byte for byte.

What a chapter prints is the same on every run (the chapters are seeded), except
for three things that change from run to run or from clone to clone:

- **warnings**: Python prefixes each with the file and line that raised it, a
  temporary file for code in a cell. Every kernel of the build runs
  ``kernel_startup.py`` first (through PYTHONSTARTUP, set here for the kernels
  MyST-NB starts and by scripts/execute_chapters.py for its own), which shows a
  warning as its category and message only;
- **output boxes**: a kernel sends what a cell prints in one message or in
  several, depending on timing. ``nb_merge_streams`` (``_config.yml``) shows one box
  per stream, but MyST-NB 1.4 strips the end of every piece before joining them, so
  ``print(a, b)`` still came out on one line in one build and on two in another.
  Here the pieces are first joined exactly as printed (as nbclient's
  ``coalesce_streams`` does), then handed to MyST-NB's own merge;
- **memory addresses** in the default repr of an object
  (``<AddBackward0 object at 0x7fad3c2b1e50>``): on each page, each distinct
  address is replaced by ``0x…1``, ``0x…2``, ... in order of first appearance, so
  one object keeps one number and two objects never share one. Only the cells'
  outputs are touched, never the prose.

Anything else that varies is caught by tests/test_reproducible.py, which builds the
book twice and compares the pages.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

from docutils import nodes

KERNEL_STARTUP = Path(__file__).with_name("kernel_startup.py")

# "<Foo object at 0x7f..>", "<function f at 0x7f..>", "<weakref at 0x7f..; to ..>"
ADDRESS = re.compile(r"(?<=\bat )0x[0-9a-fA-F]+\b")


def use_kernel_startup(environ=os.environ) -> None:
    """Make every kernel started from this environment run kernel_startup.py first."""
    environ["PYTHONSTARTUP"] = str(KERNEL_STARTUP)


class AddressNumbers:
    """Replaces each distinct address by its number of first appearance on a page."""

    def __init__(self):
        self.numbers: dict[str, int] = {}

    def __call__(self, text: str) -> str:
        def number(match):
            return f"0x…{self.numbers.setdefault(match.group(0), len(self.numbers) + 1)}"

        return ADDRESS.sub(number, text)


def join_stream_pieces(outputs: list) -> list:
    """Each stream's pieces joined into its first piece, exactly as printed.

    What is left is what MyST-NB's merge would get from a kernel that sent each
    stream of the cell in one message.
    """
    joined, first_of = [], {}
    for output in outputs:
        if output.get("output_type") == "stream":
            if output["name"] in first_of:
                first_of[output["name"]]["text"] += output["text"]
                continue
            output = copy.copy(output)  # the notebook keeps its pieces
            first_of[output["name"]] = output
        joined.append(output)
    return joined


def _merge_streams_exactly() -> None:
    from myst_nb.core import render

    merge = getattr(render, "coalesce_streams", None)
    if merge is None:
        raise RuntimeError(
            "stable_outputs: myst_nb.core.render.coalesce_streams is gone; "
            "this MyST-NB is not the pinned 1.4: check how it merges streams"
        )
    if getattr(merge, "joins_pieces_first", False):
        return

    def merge_exactly(outputs):
        return merge(join_stream_pieces(outputs))

    merge_exactly.joins_pieces_first = True
    render.coalesce_streams = merge_exactly


def _is_cell_output(node) -> bool:
    return isinstance(node, nodes.container) and "cell_output" in node.get("classes", [])


def stabilise_outputs(doctree: nodes.Node) -> int:
    """Number the addresses in every cell output of a page; return how many distinct."""
    stable = AddressNumbers()
    for output in list(doctree.findall(_is_cell_output)):
        for text in list(output.findall(nodes.Text)):
            new = stable(str(text))
            if new != str(text):
                text.parent.replace(text, nodes.Text(new))
        # Sphinx highlights a literal block only while its rawsource equals its text,
        # and writes a raw node's rawsource: keep both in step with the text.
        for node in output.findall(lambda n: isinstance(n, (nodes.literal_block, nodes.raw))):
            if node.rawsource:
                node.rawsource = stable(node.rawsource)
    return len(stable.numbers)


def _on_doctree_read(app, doctree):
    stabilise_outputs(doctree)


def setup(app):
    # Set before any notebook is read, so the kernels MyST-NB starts inherit it.
    use_kernel_startup()
    _merge_streams_exactly()
    app.connect("doctree-read", _on_doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
