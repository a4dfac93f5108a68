"""Sphinx extension: the book's two layers on every page.

The *reader's path* is what a page shows; the *proof layer* runs on every build and
sits one click away. Two ways to put something on the proof layer:

- a code cell tagged ``check`` (its assertions) is shown folded, as one line,
  ``✓ checked — show the assertion``, that opens to the code. The cell still runs
  on every build and in the tests; a downloaded notebook shows it like any cell.
  It uses MyST-NB's own folding (``hide-input``), with the book's prompt.
- cells between a markdown cell holding ``{going-deeper-start} <title>`` and one
  holding ``{going-deeper-end}`` go into one folded box, ``Going deeper: <title>``:
  the sweeps that only re-confirm a rule already shown. They are siblings on the
  page (no heading between the two markers: the build fails otherwise).

Code that only builds a table or a picture whose output *is* the lesson is tagged
``hide-input`` (MyST-NB's own tag): its output stays on the path.
"""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.errors import ExtensionError
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

CHECK_TAG = "check"
CHECK_SHOW = "✓ checked — show the assertion"
CHECK_HIDE = "✓ checked — hide the assertion"
DEEPER_PREFIX = "Going deeper: "


class going_deeper(nodes.General, nodes.Element):
    """A folded box of cells: ``<details class="going-deeper">``."""


class going_deeper_start(nodes.General, nodes.Element):
    pass


class going_deeper_end(nodes.General, nodes.Element):
    pass


class GoingDeeperStart(SphinxDirective):
    required_arguments = 1
    final_argument_whitespace = True
    has_content = False

    def run(self):
        node = going_deeper_start(title=self.arguments[0].strip())
        node.source, node.line = self.get_source_info()
        return [node]


class GoingDeeperEnd(Directive):
    has_content = False

    def run(self):
        return [going_deeper_end()]


class MergeGoingDeeper(SphinxTransform):
    """Move everything between a start and its end marker into one going_deeper node."""

    default_priority = 10

    def apply(self):
        for start in list(self.document.findall(going_deeper_start)):
            parent = start.parent
            siblings = parent.children
            index = siblings.index(start)
            after = range(index + 1, len(siblings))
            end = next((i for i in after if isinstance(siblings[i], going_deeper_end)), None)
            nested = [
                i
                for i in range(index + 1, end if end is not None else len(siblings))
                if isinstance(siblings[i], going_deeper_start)
            ]
            if end is None or nested:
                raise ExtensionError(
                    f"{start.source}:{start.line}: {{going-deeper-start}} "
                    f"'{start['title']}' has no {{going-deeper-end}} after it in the same "
                    "section (a heading between the two, a nested start, or a missing end)"
                )
            box = going_deeper(title=start["title"], classes=["going-deeper"])
            box.extend(siblings[index + 1 : end])
            parent.children[index : end + 1] = [box]
            box.parent = parent
            for child in box.children:
                child.parent = box
        for end in list(self.document.findall(going_deeper_end)):
            raise ExtensionError(f"{end.source}:{end.line}: {{going-deeper-end}} without a start")


class FoldChecks(SphinxPostTransform):
    """A cell tagged ``check`` folds its code behind the book's one-line marker.

    Runs before MyST-NB's own HideInputCells (priority 199), which does the folding.
    """

    default_priority = 150

    def run(self, **kwargs):
        for node in self.document.findall(nodes.container):
            if node.get("nb_element") != "cell_code":
                continue
            tags = node.get("cell_metadata", {}).get("tags", [])
            if CHECK_TAG in tags:
                node["hide_mode"] = "input"
                node["prompt_show"] = CHECK_SHOW
                node["prompt_hide"] = CHECK_HIDE
                node["classes"].append("book-check")


def visit_going_deeper_html(self, node):
    self.body.append('<details class="going-deeper admonition">\n')
    title = self.encode(DEEPER_PREFIX + node["title"])
    self.body.append(f'<summary class="admonition-title">{title}</summary>\n')


def depart_going_deeper_html(self, node):
    self.body.append("</details>\n")


def _pass(self, node):
    pass


def setup(app):
    app.add_node(
        going_deeper,
        html=(visit_going_deeper_html, depart_going_deeper_html),
        latex=(_pass, _pass),
        text=(_pass, _pass),
    )
    for marker in (going_deeper_start, going_deeper_end):
        app.add_node(marker, html=(_pass, _pass), latex=(_pass, _pass), text=(_pass, _pass))
    app.add_directive("going-deeper-start", GoingDeeperStart)
    app.add_directive("going-deeper-end", GoingDeeperEnd)
    app.add_transform(MergeGoingDeeper)
    app.add_post_transform(FoldChecks)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
