"""Sphinx extension: facts about the build, stated by the build itself.

- MyST substitutions ``{{ torch_version }}``, ``{{ torch_build }}``,
  ``{{ python_version }}`` and ``{{ build_date }}``, so that no version number is
  typed into the prose;
- ``{{ verified_with }}``: every torch version the chapters were verified with,
  this build's own and each one whose ``make matrix`` run matched it, read from
  the matrix's last result (``book/torch-matrix.json``, see scripts/matrix.py); a
  run made before a chapter or the helper code changed is said to verify "an earlier
  version of the book", and the changes are listed;
- on every executed page (the chapters), a line under the title saying which torch
  ran its code and when: the date of the execution itself, as recorded by MyST-NB
  (a chapter served from the execution cache keeps the date it really ran);
- each page's scripts listed once, and bibliography entries marked as list items
  (two fixes for the browser tests, see ``_drop_duplicate_scripts`` and
  ``_bibliography_roles``).
"""

import datetime
import html
import json
import platform
from pathlib import Path

import torch

from book_inputs import execution_inputs

# Written by `make matrix` (scripts/matrix.py), relative to the book's folder.
MATRIX_RESULT = Path("book") / "torch-matrix.json"


def stamp_values():
    """The substitutions this extension provides, computed now."""
    return {
        "torch_version": torch.__version__.split("+")[0],
        "torch_build": torch.__version__,
        "python_version": platform.python_version(),
        "build_date": datetime.date.today().isoformat(),
    }


def verified_with(root: Path, result_file: Path | None = None) -> str:
    """The "verified with" sentence: this build's torch, and every matching matrix run."""
    result_file = result_file or Path(root) / MATRIX_RESULT
    ours = f"torch {stamp_values()['torch_version']} (this build)"
    if not result_file.is_file():
        return f"{ours}; no `make matrix` run is recorded."
    result = json.loads(result_file.read_text("utf-8"))
    now = execution_inputs(root)
    matched, other = [ours], []
    for run in result["runs"]:
        version = run["torch"].split("+")[0]
        if run["matched"] and _covers_nothing(run, result, now):
            # said in plain words, so an old run is not read as verifying today's pages
            other.append(
                f" torch {version} verified an earlier version of the book (`make matrix` of "
                f"{result['date']}, every output the same); the helper code or every chapter "
                "has changed since, so that run covers no page built now."
            )
        elif run["matched"]:
            changed = [
                Path(name).stem
                for name in sorted(set(now["notebooks"]) | set(run["chapters"]))
                if now["notebooks"].get(name) != run["chapters"].get(name, {}).get("hash")
            ]
            since = []
            if changed:
                since.append(f"chapters changed since: {', '.join(changed)}")
            note = f"; {'; '.join(since)}" if since else ""
            # A run of older chapters verified those, not the pages built now.
            which = " for an earlier version of the book" if since else ""
            matched.append(
                f"torch {version}{which} (`make matrix` of {result['date']}: "
                f"every output the same{note})"
            )
        else:
            cells = sum(len(c["differences"]) for c in run["chapters"].values())
            other.append(
                f" torch {version} gave different outputs in {cells} cells"
                f"{' and could not run everything' if run['failed'] else ''}"
                f" (`make matrix` of {result['date']})."
            )
    listed = ", ".join(matched[:-1]) + " and " + matched[-1] if len(matched) > 1 else ours
    return f"{listed}.{''.join(other)}"


def _covers_nothing(run: dict, result: dict, now: dict) -> bool:
    """Has the helper code, or every chapter, changed since this matrix run?"""
    if result.get("helpers") != now["helpers"]:
        return True
    return all(
        run["chapters"].get(name, {}).get("hash") != digest
        for name, digest in now["notebooks"].items()
    )


def _add_substitutions(app, config):
    # Values already set in _config.yml win, so a publisher can override them.
    values = {**stamp_values(), "verified_with": verified_with(Path(app.srcdir))}
    config.myst_substitutions = {**values, **(config.myst_substitutions or {})}


def _execution_record(env, docname):
    from myst_nb.sphinx_ import NbMetadataCollector

    try:
        return NbMetadataCollector.get_exec_data(env, docname)
    except KeyError:
        return None


def _stamp_executed_pages(app, pagename, templatename, context, doctree):
    # Written into the page's HTML after Sphinx has indexed it for search: the date
    # is the one thing allowed to differ between two builds of the same commit
    # (across days), and this way it differs in this paragraph only, not also in
    # searchindex.js.
    record = _execution_record(app.env, pagename)
    body = context.get("body", "")
    if not record or not record.get("succeeded") or "</h1>" not in body:
        return
    ran_on = datetime.datetime.fromtimestamp(record["mtime"], datetime.timezone.utc).date()
    values = stamp_values()
    text = (
        f"Verified: the code on this page ran with torch {values['torch_version']} "
        f"(Python {values['python_version']}) on {ran_on.isoformat()}."
    )
    stamp = f'\n<p class="verified-stamp">{html.escape(text)}</p>'
    context["body"] = body.replace("</h1>", "</h1>" + stamp, 1)


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    # sphinx-thebe registers its inline configuration script from an event that Sphinx
    # 7 replays into the page's script list, so every page declared `const
    # THEBE_JS_URL` twice and the browser reported a SyntaxError. Keep one of each.
    seen, unique = set(), []
    for script in context.get("script_files", []):
        # the replayed copy has filename '' where the original has None
        key = (
            getattr(script, "filename", script) or "",
            tuple(sorted(getattr(script, "attributes", {}).items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _bibliography_roles(app, pagename, templatename, context, doctree):
    # Docutils marks each bibliography entry role="doc-biblioentry", an ARIA role now
    # deprecated; screen readers (and axe) then see a role="list" whose items are not
    # list items. Each entry is a list item.
    body = context.get("body", "")
    if 'role="doc-biblioentry"' in body:
        context["body"] = body.replace('role="doc-biblioentry"', 'role="listitem"')


def setup(app):
    app.connect("config-inited", _add_substitutions)
    app.connect("html-page-context", _stamp_executed_pages)
    app.connect("html-page-context", _drop_duplicate_scripts)
    app.connect("html-page-context", _bibliography_roles)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
