"""The pinned environment: complete, consistent, and the same on Binder."""

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import nbcheck

ROOT = nbcheck.ROOT
DIRECT = [
    "torch",
    "jupyter-book",
    "sphinx-exercise",
    "matplotlib",
    "graphviz",
    "torchviz",
    "ipykernel",
    "scikit-learn",
    "sphinx-mathjax-offline",
]


def pins(path: Path) -> dict[str, str]:
    """name -> version for every `name==version` line, following `-r` includes."""
    found = {}
    for line in path.read_text("utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def test_every_dependency_of_the_book_is_pinned():
    pinned = pins(ROOT / "requirements.txt")
    needed, todo = set(), [canonicalize_name(n) for n in DIRECT]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for spec in metadata.requires(name) or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    assert sorted(needed - set(pinned)) == []


def test_pins_match_what_is_installed():
    for name, version in pins(ROOT / "requirements-dev.txt").items():
        installed = metadata.version(name).split("+")[0]
        assert installed == version, f"{name}: pinned {version}, installed {installed}"


def test_torch_is_the_cpu_build_of_the_pinned_version():
    assert pins(ROOT / "requirements.txt")["torch"] == "2.13.0"


def test_binder_installs_the_same_pins_with_a_cpu_torch():
    binder = ROOT / "binder"
    text = (binder / "requirements.txt").read_text("utf-8")
    book = pins(ROOT / "requirements.txt")
    assert "-r ../requirements.txt" in text.splitlines()
    own = [line for line in text.splitlines() if "==" in line.split("#")[0]]
    assert own == [f"torch=={book['torch']}+cpu"], "binder/ pins something of its own"
    assert re.search(r"^--extra-index-url \S+/whl/cpu$", text, re.M)
    on_binder = pins(binder / "requirements.txt")
    assert {k: v.split("+")[0] for k, v in on_binder.items()} == book
    assert (binder / "runtime.txt").read_text().strip() == "python-3.11"
    assert "graphviz" in (binder / "apt.txt").read_text().split()


def test_setup_script_and_binder_agree_on_python():
    script = (ROOT / "scripts" / "setup-env").read_text("utf-8")
    assert "sys.version_info[:2] != (3, 11)" in script
