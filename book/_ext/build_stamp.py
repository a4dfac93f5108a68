"""Sphinx extension: facts about the build, stated by the build itself.

- MyST substitutions ``{{ torch_version }}``, ``{{ torch_build }}``,
  ``{{ python_version }}`` and ``{{ build_date }}``, so that no version number is
  typed into the prose;
- on every executed page (the chapters), a line under the title saying which torch
  ran its code and when: the date of the execution itself, as recorded by MyST-NB
  (a chapter served from the execution cache keeps the date it really ran).
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
    text = (f"Verified: the code on this page ran with torch {values['torch_version']} "
            f"(Python {values['python_version']}) on {ran_on.isoformat()}.")
    stamp = nodes.paragraph(text, text, classes=["verified-stamp"])
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is not None and section.children and isinstance(section[0], nodes.title):
        section.insert(1, stamp)


def setup(app):
    app.connect("config-inited", _add_substitutions)
    app.connect("doctree-resolved", _stamp_executed_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
