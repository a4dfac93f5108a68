"""Sphinx extension: the ``error-index`` directive, and what it reads from the pages.

The index lists every error a page of the book raises on purpose, each with its
explanation from ``book/error-explanations.yml`` and a link to every section that
shows it. A page shows an error on purpose in one of four ways, all read from the
notebooks the book builds (``error_claims``):

- **declared**: a cell that fails declares the exact type and message in its
  ``expected_error`` metadata (the tests check it against what the cell raised);
- **printed**: a cell prints a caught error as a traceback's last line does,
  ``RuntimeError: <message>``, as ``gradstop.show_error`` does; read from the
  outputs of the build's own run (its execution cache);
- **checked**: a cell catches an error and compares its message with a string,
  ``str(err) == "..."``, ``str(err).startswith("...")``, ``"..." in str(err)``, or
  through ``gradstop.assert_raises`` / ``show_error``, whose message argument is
  the start of the error's message; read from the cell's code;
- **named in an output**: a printed line holds the start of an index entry's
  message (a cell that prints ``str(err)[:75]``).

An entry is keyed by the start of the message; ``…`` in a key stands for one word
that varies (``derivative for … is not implemented``). A declared error with no entry stops the
build. An error printed or checked with no entry does not (the build of a page that
is being written must go on): ``tests/test_error_index_complete.py`` fails on it, and
says where it is and what to add.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes
from sphinx.errors import ExtensionError

from book_inputs import toc_notebooks

ROOT = Path(__file__).resolve().parents[2]
EXPLANATIONS = ROOT / "book" / "error-explanations.yml"
WILDCARD = "…"
# Characters of a key's start that identify its error inside a printed line.
PREFIX = 30
# A checked string shorter than this names no message ("Tanh" in str(err)).
SHORTEST_FRAGMENT = 12
# "RuntimeError: message", as a traceback's last line (and gradstop.show_error) prints it.
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Z]\w*(?:Error|Exception)): (?P<message>\S.*)$")
# Methods of a message that leave a message (str(err).lower().startswith(...)).
TEXT_METHODS = {"lower", "casefold", "strip", "rstrip", "lstrip", "split", "splitlines"}
FOLDING = {"lower", "casefold"}
HELPERS = {"show_error", "assert_raises"}  # gradstop/errors.py
BROAD = {"Exception", "BaseException"}


# --- keys ---------------------------------------------------------------------------


def _pattern(key: str) -> re.Pattern:
    return re.compile(r"\S+?".join(re.escape(part) for part in key.split(WILDCARD)))


def key_matches_message(key: str, message: str) -> bool:
    """The whole message starts as the key says (``…`` matching any text)."""
    return _pattern(key).match(message) is not None


def _could_start(fragment: str, parts: list[str]) -> bool:
    """A message of these parts (joined by any text, followed by any) can start so."""
    first, rest = parts[0], parts[1:]
    if len(fragment) <= len(first):
        return first.startswith(fragment)
    if not fragment.startswith(first):
        return False
    after = fragment[len(first) :]
    if not rest:
        return True
    # The wildcard stands for one word (a number, an operation's name): no spaces.
    word = len(after) - len(after.lstrip()) == 0 and len(after.split(None, 1)[0])
    if word and word == len(after):
        return True  # the piece ends inside the word
    return any(_could_start(after[i:], rest) for i in range(1, (word or 0) + 1))


def key_matches_fragment(key: str, fragment: str, folded: bool = False) -> bool:
    """A piece of a message (checked with startswith, in, ==) belongs to the key's error:
    the piece can start such a message, or lies inside one of the key's parts."""
    if folded:
        key, fragment = key.casefold(), fragment.casefold()
    parts = key.split(WILDCARD)
    return _could_start(fragment, parts) or any(fragment in part for part in parts)


def key_prefix(key: str) -> str:
    """The first PREFIX characters of a key: enough to know its error in a printed line."""
    return key[:PREFIX]


def prefix_in(key: str, line: str) -> bool:
    return _pattern(key_prefix(key)).search(line) is not None


def explanation_for(message: str, explanations: dict) -> tuple[str, dict]:
    """The entry of a whole message: the longest key it matches; the build stops without."""
    key = entry_for_message(message, explanations)
    if key is None:
        raise ExtensionError(
            f"error-index: no explanation for {message[:80]!r}; add an entry keyed by the "
            "start of this message to book/error-explanations.yml"
        )
    return key, explanations[key]


def entry_for_message(message: str, keys) -> str | None:
    matches = [key for key in keys if key_matches_message(key, message)]
    return max(matches, key=len) if matches else None


def entry_for_fragment(fragment: str, keys, folded: bool = False) -> str | None:
    """The entry a checked piece of a message belongs to: one it can start, else one
    it lies inside; the longest key of those."""
    keys = list(keys)

    def fold(text):
        return text.casefold() if folded else text

    starts = [k for k in keys if _could_start(fold(fragment), fold(k).split(WILDCARD))]
    inside = [k for k in keys if key_matches_fragment(k, fragment, folded)]
    matches = starts or inside
    return max(matches, key=len) if matches else None


# --- what a page shows ----------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """One error a cell shows on purpose, as the page states it."""

    how: str  # "declared", "printed", "checked", "named in an output"
    text: str  # the whole message (exact) or the piece the cell checks
    exact: bool
    type: str | None  # the exception's class name, where the page says it
    folded: bool = False  # checked after .lower()
    handler: int = 0  # which except clause of the cell (checked claims)


@dataclass
class Cell:
    path: Path
    index: int
    chapter: str
    section: str
    claims: list[Claim] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)  # lines of its text outputs

    def where(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}, cell {self.index} (“{self.section}”)"


def _heading(line: str) -> tuple[int, str] | None:
    if line.startswith("#"):
        level = len(line) - len(line.lstrip("#"))
        if line[level : level + 1] == " ":
            return level, line[level:].strip()
    return None


def _python(source: str) -> ast.AST | None:
    """A cell's code as Python (IPython's magics turned into calls), or None."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except ImportError:  # pragma: no cover - IPython is part of the book's pins
        pass
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _type_name(node) -> str | None:
    if isinstance(node, ast.Name):
        return None if node.id in BROAD else node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _text_of(node, errors: set[str], texts: dict[str, tuple[bool, bool]]):
    """If ``node`` is an error's message: (exact, folded); else None.

    ``errors`` are the names bound by ``except ... as``; ``texts`` the names bound to
    a message in the cell, each with (exact, folded).
    """
    if isinstance(node, ast.Name):
        if node.id in errors:
            return (False, False)
        return texts.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id in ("str", "repr") and len(node.args) == 1:
            arg = node.args[0]
            if isinstance(arg, ast.Name) and arg.id in errors:
                return (node.func.id == "str", False)
            return _text_of(arg, errors, texts)
    if isinstance(node, ast.Subscript):
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "args":
            if isinstance(value.value, ast.Name) and value.value.id in errors:
                index = node.slice
                exact = isinstance(index, ast.Constant) and index.value == 0
                return (exact, False)
        inner = _text_of(value, errors, texts)
        return (False, inner[1]) if inner else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in TEXT_METHODS:
            inner = _text_of(node.func.value, errors, texts)
            if inner:
                return (False, inner[1] or node.func.attr in FOLDING)
    return None


def _strings(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple):
        return [s for element in node.elts for s in _strings(element)]
    return []


def _checks(tree, errors, texts, type_name, handler) -> list[Claim]:
    """The strings a message is compared with, anywhere in ``tree``."""
    found = []

    def claim(text, exact, folded):
        if len(text) >= SHORTEST_FRAGMENT:
            found.append(Claim("checked", text, exact, type_name, folded, handler))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, op, right = node.left, node.ops[0], node.comparators[0]
            if isinstance(op, (ast.Eq, ast.NotEq)):
                for text_side, other in ((left, right), (right, left)):
                    text = _text_of(text_side, errors, texts)
                    for string in _strings(other) if text else []:
                        claim(string, text[0], text[1])
            elif isinstance(op, (ast.In, ast.NotIn)):
                text = _text_of(right, errors, texts)
                for string in _strings(left) if text else []:
                    claim(string, False, text[1])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith") and node.args:
                text = _text_of(node.func.value, errors, texts)
                for string in _strings(node.args[0]) if text else []:
                    claim(string, False, text[1])
    return found


def _helper_calls(tree) -> list[Claim]:
    """gradstop's show_error(action, message, error) and assert_raises(...)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in HELPERS:
            continue
        arguments = {k.arg: k.value for k in node.keywords}
        message = node.args[1] if len(node.args) > 1 else arguments.get("message")
        error = node.args[2] if len(node.args) > 2 else arguments.get("error")
        type_name = _type_name(error) if error is not None else "RuntimeError"
        for string in _strings(message) if message is not None else []:
            found.append(Claim("checked", string, False, type_name, handler=-1 - len(found)))
    return found


def checked_claims(source: str) -> list[Claim]:
    """Every message a cell's code compares a caught error with."""
    tree = _python(source)
    if tree is None:
        return []
    claims = _helper_calls(tree)
    handlers = [n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name]
    for number, handler in enumerate(handlers):
        errors = {handler.name}
        type_name = _type_name(handler.type)
        # Names the handler binds to the message, checked anywhere in the cell.
        texts: dict[str, tuple[bool, bool]] = {}
        for node in ast.walk(handler):
            if isinstance(node, ast.Assign):
                text = _text_of(node.value, errors, texts)
                for target in node.targets if text else []:
                    if isinstance(target, ast.Name):
                        texts[target.id] = text
        claims += _checks(handler, errors, texts, type_name, number)
        if texts:
            outside = ast.Module(body=[n for n in tree.body], type_ignores=[])
            for claim in _checks(outside, set(), texts, type_name, number):
                if claim not in claims:
                    claims.append(claim)
    return claims


def _output_lines(cell) -> list[str]:
    """What a cell printed: its streams, and the plain text of its results."""
    lines = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            text = output.get("text", "")
        elif output.get("output_type") in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain", "")
            if "text/html" in output.get("data", {}) or "image/svg+xml" in output.get("data", {}):
                text = ""  # a table or picture: its plain text is a repr
        else:
            continue
        text = "".join(text) if isinstance(text, list) else text
        lines += text.splitlines()
    return lines


def page_cells(path: Path, executed=None) -> list[Cell]:
    """Each code cell of a notebook that shows an error, with its chapter and section.

    ``executed`` is the notebook as the build ran it (cells with outputs), or None.
    """
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    ran = executed["cells"] if executed is not None else [{}] * len(cells)
    chapter, section, found = Path(path).stem, None, []
    for index, (cell, run) in enumerate(zip(cells, ran, strict=True)):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            fenced = False
            for line in source.splitlines():
                if line.lstrip().startswith(("```", "~~~")):
                    fenced = not fenced
                heading = None if fenced else _heading(line)
                if heading and heading[0] == 1:
                    chapter = heading[1]
                elif heading and heading[0] in (2, 3):
                    section = heading[1]
            continue
        if cell["cell_type"] != "code":
            continue
        here = Cell(Path(path), index, chapter, section or chapter)
        declared = cell.get("metadata", {}).get("expected_error")
        if declared:
            here.claims.append(Claim("declared", declared["message"], True, declared["type"]))
        here.claims += checked_claims(source)
        here.printed = _output_lines(run)
        for line in here.printed:
            match = EXCEPTION_LINE.match(line)
            if match and match["type"] != "AssertionError":
                here.claims.append(Claim("printed", match["message"], True, match["type"]))
        if here.claims or here.printed:
            found.append(here)
    return found


@dataclass
class Resolved:
    """Each claim tied to its index entry, and those no entry covers."""

    shown: dict[str, list[tuple[Cell, Claim]]] = field(default_factory=dict)
    unindexed: list[tuple[Cell, Claim]] = field(default_factory=list)


def resolve(cells: list[Cell], keys) -> Resolved:
    keys = list(keys)
    result = Resolved()

    def show(key, cell, claim):
        result.shown.setdefault(key, []).append((cell, claim))

    for cell in cells:
        in_output = set()
        for key in keys:
            if any(prefix_in(key, line) for line in cell.printed):
                in_output.add(key)
                show(key, cell, Claim("named in an output", key_prefix(key), False, None))
        checked: dict[int, list[tuple[Claim, str | None]]] = {}
        for claim in cell.claims:
            if claim.exact:
                key = entry_for_message(claim.text, keys)
            else:
                key = entry_for_fragment(claim.text, keys, claim.folded)
            if claim.how == "checked":
                checked.setdefault(claim.handler, []).append((claim, key))
            if key is not None:
                show(key, cell, claim)
            elif claim.how != "checked":
                result.unindexed.append((cell, claim))
        # A handler may check the details of its error as well as its start
        # ("which is output 0 of Tanh,"): it is covered when one of its strings is,
        # or when the cell prints the start of an indexed message.
        for claims in checked.values():
            if not any(key for _, key in claims) and not in_output:
                result.unindexed += [(cell, claim) for claim, _ in claims]
    return result


def book_claims(notebooks: list[Path], executed_of=None) -> list[Cell]:
    """Every cell of the given notebooks that shows an error (``executed_of(path)``:
    the notebook as the build ran it, or None)."""
    cells = []
    for path in notebooks:
        cells += page_cells(path, executed_of(path) if executed_of else None)
    return cells


def load_explanations(path: Path = EXPLANATIONS) -> dict:
    return yaml.safe_load(Path(path).read_text("utf-8"))


# --- the directive --------------------------------------------------------------------


def _plain(title: str) -> str:
    return title.replace("`", "")


def shown_title(title: str) -> str:
    """A heading as plain text inside the index's “…”: no code ticks, no emphasis marks,
    and its own "quotes" as the inner ‘quotes’ (not “"doubled"”)."""
    text = re.sub(r"(\*{1,2})(?=\S)([^*]+?)(?<=\S)\1", r"\2", _plain(title))
    return re.sub(r'"([^"]*)"', "\u2018\\1\u2019", text)


def section_anchor(title: str) -> str:
    return nodes.make_id(_plain(title))


def _executed_from_cache(env):
    """A function giving each notebook as the build's run left it (None if not cached)."""
    config = getattr(env, "mystnb_config", None)
    cache_path = getattr(config, "execution_cache_path", "") or ""
    if not cache_path or not Path(cache_path).is_dir():
        return None
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(cache_path)

    def executed(path):
        try:
            return cache.merge_match_into_notebook(nbformat.read(path, as_version=4))[1]
        except KeyError:
            return None

    return executed


def index_entries(notebooks, explanations, executed_of=None, docname_of=str):
    """The index: {key: {"text", "type", "messages", "shown": [(docname, chapter, section)]}}.

    A declared message with no entry raises ExtensionError.
    """
    cells = book_claims(notebooks, executed_of)
    for cell in cells:
        for claim in cell.claims:
            if claim.how == "declared":
                explanation_for(claim.text, explanations)
    resolved = resolve(cells, explanations)
    entries: dict[str, dict] = {}
    for key, shown in resolved.shown.items():
        entry = {"text": explanations[key], "type": None, "messages": [], "shown": []}
        for cell, claim in shown:
            place = (docname_of(cell.path), cell.chapter, cell.section)
            if place not in entry["shown"]:
                entry["shown"].append(place)
            if claim.exact and claim.type and (claim.type, claim.text) not in entry["messages"]:
                entry["messages"].append((claim.type, claim.text))
            entry["type"] = entry["type"] or claim.type
        entries[key] = entry
    return entries


class ErrorIndex(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        explanations = load_explanations()
        env.note_dependency(str(EXPLANATIONS))
        docs = [d for d in env.found_docs if str(env.doc2path(d)).endswith(".ipynb")]
        paths = {Path(env.doc2path(d)).resolve(): d for d in docs}
        # In the book's reading order, so that "Shown in" reads from chapter 1 on.
        order = {p.resolve(): i for i, p in enumerate(toc_notebooks(ROOT))}
        paths = dict(sorted(paths.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[1])))
        for path in paths:
            env.note_dependency(str(path))
        entries = index_entries(
            list(paths), explanations, _executed_from_cache(env), lambda p: paths[p.resolve()]
        )
        result = []
        for key, entry in sorted(entries.items(), key=lambda kv: kv[0].lower()):
            section = nodes.section(ids=[nodes.make_id("error " + key)])
            section += nodes.title(text=key)
            for type_name, message in entry["messages"]:
                section += nodes.literal_block(
                    message, f"{type_name}: {message}", classes=["error-message"]
                )
            items = nodes.definition_list()
            for label in ("meaning", "cause", "fix"):
                item = nodes.definition_list_item()
                item += nodes.term(text=label.capitalize())
                item += nodes.definition("", nodes.paragraph(text=entry["text"][label]))
                items += item
            items += self._proofs(entry["text"].get("proof", []), env)
            items += self._shown(entry["shown"], env)
            section += items
            result.append(section)
        return result

    @staticmethod
    def _shown(places, env):
        shown = nodes.definition_list_item()
        shown += nodes.term(text="Shown in")
        links = nodes.paragraph()
        for i, (docname, chapter, title) in enumerate(places):
            if i:
                links += nodes.Text("; ")
            uri = env.app.builder.get_relative_uri(env.docname, docname)
            links += nodes.reference(
                "",
                f"{shown_title(chapter)}, “{shown_title(title)}”",
                refuri=f"{uri}#{section_anchor(title)}",
                internal=True,
            )
        shown += nodes.definition("", links)
        return [shown]

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
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
