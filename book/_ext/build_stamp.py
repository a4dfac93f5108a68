"""Sphinx extension: facts about the build, stated by the build itself.

- MyST substitutions ``{{ torch_version }}``, ``{{ torch_build }}``,
  ``{{ python_version }}`` and ``{{ build_date }}``, so that no version number is
  typed into the prose;
- on every executed page (the chapters), a line under the title saying which torch
  ran its code and when: the date of the execution itself, as recorded by MyST-NB
  (a chapter served from the execution cache keeps the date it really ran);
- each page's scripts listed once, and bibliography entries marked as list items
  (two fixes for the browser tests, see ``_drop_duplicate_scripts`` and
  ``_bibliography_roles``).
"""

import datetime
import platform

import torch
from docutils import nodes


def stamp_values():
    """The substitutions this extension provides, computed now."""
    return {
        "torch_version": torch.__version__.split("+")[0],
        "torch_build": torch.__version__,
        "python_version": platform.python_version(),
        "build_date": datetime.date.today().isoformat(),
    }


def _add_substitutions(app, config):
    # Values already set in _config.yml win, so a publisher can override them.
    config.myst_substitutions = {**stamp_values(), **(config.myst_substitutions or {})}


def _execution_record(env, docname):
    from myst_nb.sphinx_ import NbMetadataCollector

    try:
        return NbMetadataCollector.get_exec_data(env, docname)
    except KeyError:
        return None


def _stamp_executed_pages(app, doctree, docname):
    record = _execution_record(app.env, docname)
    if not record or not record.get("succeeded"):
        return
    ran_on = datetime.datetime.fromtimestamp(record["mtime"], datetime.timezone.utc).date()
    values = stamp_values()
    text = (
        f"Verified: the code on this page ran with torch {values['torch_version']} "
        f"(Python {values['python_version']}) on {ran_on.isoformat()}."
    )
    stamp = nodes.paragraph(text, text, classes=["verified-stamp"])
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is not None and section.children and isinstance(section[0], nodes.title):
        section.insert(1, stamp)


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
    app.connect("doctree-resolved", _stamp_executed_pages)
    app.connect("html-page-context", _drop_duplicate_scripts)
    app.connect("html-page-context", _bibliography_roles)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
