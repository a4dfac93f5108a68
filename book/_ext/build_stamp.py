"""Sphinx extension: facts about the build environment, read when the book is built.

Pages say which torch they were verified with through MyST substitutions
(``{{ torch_version }}``), so no version number is ever typed into the prose.
"""

import datetime
import platform

import torch


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


def setup(app):
    app.connect("config-inited", _add_substitutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
