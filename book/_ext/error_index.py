"""Sphinx extension: the ``error-index`` directive.

It lists every error the chapters trigger on purpose, read from the
``expected_error`` declarations in the notebooks the book builds (the same
declarations the tests check against the executed output), so the index cannot
drift from what the chapters show. Each entry links to the section that
demonstrates it, and takes its explanation from ``book/error-explanations.yml``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.errors import ExtensionError

ROOT = Path(__file__).resolve().parents[2]


def _heading(source: str) -> tuple[int, str] | None:
    for line in source.splitlines():
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            return level, line[level:].strip()
    return None


def declared_errors(env) -> list[dict]:
    """Every declared expected error: message, type, chapter, section title, chapter title.

    Read from the notebooks Sphinx builds (with only_build_toc_files, those of _toc.yml).
    """
    found = []
    notebooks = sorted(d for d in env.found_docs if str(env.doc2path(d)).endswith(".ipynb"))
    for docname in notebooks:
        path = Path(env.doc2path(docname))
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        chapter, section = docname, None
        for cell in cells:
            if cell["cell_type"] == "markdown":
                for line in "".join(cell["source"]).splitlines():
                    heading = _heading(line)
                    if heading and heading[0] == 1:
                        chapter = heading[1]
                    elif heading and heading[0] in (2, 3):
                        section = heading[1]
            declared = cell.get("metadata", {}).get("expected_error")
            if cell["cell_type"] == "code" and declared:
                found.append(
                    {
                        **declared,
                        "docname": docname,
                        "chapter": chapter,
                        "section": section or chapter,
                    }
                )
    return found


def explanation_for(message: str, explanations: dict) -> tuple[str, dict]:
    matches = [key for key in explanations if message.startswith(key)]
    if not matches:
        raise ExtensionError(
            f"error-index: no explanation for {message[:80]!r}; add an entry keyed by the "
            "start of this message to book/error-explanations.yml"
        )
    key = max(matches, key=len)
    return key, explanations[key]


def _plain(title: str) -> str:
    return title.replace("`", "")


class ErrorIndex(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        explanations = yaml.safe_load((ROOT / "book" / "error-explanations.yml").read_text("utf-8"))
        env.note_dependency(str(ROOT / "book" / "error-explanations.yml"))
        entries: dict[str, dict] = {}
        for error in declared_errors(env):
            env.note_dependency(str(env.doc2path(error["docname"])))
            key, text = explanation_for(error["message"], explanations)
            entry = entries.setdefault(
                key, {"text": text, "type": error["type"], "shown": [], "messages": []}
            )
            if error["message"] not in entry["messages"]:
                entry["messages"].append(error["message"])
            place = (error["docname"], error["chapter"], error["section"])
            if place not in entry["shown"]:
                entry["shown"].append(place)
        result = []
        for key, entry in sorted(entries.items(), key=lambda kv: kv[0].lower()):
            section = nodes.section(ids=[nodes.make_id("error " + key)])
            section += nodes.title(text=key)
            for message in entry["messages"]:
                section += nodes.literal_block(
                    message, f"{entry['type']}: {message}", classes=["error-message"]
                )
            items = nodes.definition_list()
            for label in ("meaning", "cause", "fix"):
                item = nodes.definition_list_item()
                item += nodes.term(text=label.capitalize())
                item += nodes.definition("", nodes.paragraph(text=entry["text"][label]))
                items += item
            items += self._proofs(entry["text"].get("proof", []), env)
            shown = nodes.definition_list_item()
            shown += nodes.term(text="Shown in")
            links = nodes.paragraph()
            for i, (docname, chapter, title) in enumerate(entry["shown"]):
                if i:
                    links += nodes.Text("; ")
                uri = env.app.builder.get_relative_uri(env.docname, docname)
                anchor = nodes.make_id(_plain(title))
                links += nodes.reference(
                    "",
                    f"{_plain(chapter)}, “{_plain(title)}”",
                    refuri=f"{uri}#{anchor}",
                    internal=True,
                )
            shown += nodes.definition("", links)
            items += shown
            section += items
            result.append(section)
        return result

    @staticmethod
    def _proofs(labels, env):
        """A "Proved in" item: a cross-reference to each labelled section that proves it."""
        item = nodes.definition_list_item()
        item += nodes.term(text="Proved in")
        links = nodes.paragraph()
        for i, label in enumerate(labels):
            if i:
                links += nodes.Text("; ")
            links += addnodes.pending_xref(
                "",
                nodes.inline(text=label),
                refdomain="std",
                reftype="ref",
                reftarget=label,
                refexplicit=False,
                refwarn=True,
                refdoc=env.docname,
            )
        item += nodes.definition("", links)
        return [item] if labels else []


def setup(app):
    app.add_directive("error-index", ErrorIndex)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
