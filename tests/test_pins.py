"""The pinned environment: complete, consistent, the same on Binder, and installable on
the oldest Python 3.11 the README promises (Debian 12's 3.11.2)."""

import json
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
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
]
# Pins that once stopped `make book` on Debian 12's Python 3.11.2 (issue 20): each
# release requires a newer Python. The resolve test below is shown to fail with them.
PINS_THAT_REJECTED_3_11_2 = {"soupsieve": "4.1.3"}


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


# --- the installed environment: exactly the pins, and torch's CPU build ---------------


def torch_build_problems(pinned: str) -> list[str]:
    """Why the installed torch is not the CPU build of version `pinned` ([] if it is).

    A CUDA build can carry the very same version (PyPI's Linux wheel is `2.13.0`, with
    no local label), so the version alone proves nothing: a CUDA or ROCm build also
    says so in its local label (`+cu126`), in its NVIDIA dependencies, and in
    `torch.version.cuda` / `torch.version.hip`."""
    import torch

    installed = metadata.version("torch")
    base, _, label = installed.partition("+")
    problems = []
    if base != pinned:
        problems.append(f"torch {installed} is installed, {pinned} is pinned")
    if label not in ("", "cpu"):
        problems.append(f"torch {installed} is the '{label}' build, not the CPU build")
    nvidia = sorted(
        Requirement(spec).name
        for spec in metadata.requires("torch") or []
        if canonicalize_name(Requirement(spec).name).startswith("nvidia-")
    )
    if nvidia:
        problems.append(f"torch {installed} depends on NVIDIA libraries: {', '.join(nvidia)}")
    for toolkit in ("cuda", "hip"):
        if getattr(torch.version, toolkit, None):
            built = getattr(torch.version, toolkit)
            problems.append(f"torch {installed} was built for {toolkit.upper()} {built}")
    return problems


def test_pins_match_what_is_installed():
    problems = []
    for name, version in pins(ROOT / "requirements-dev.txt").items():
        if name == "torch":
            problems += torch_build_problems(version)
            continue
        installed = metadata.version(name)
        if installed != version:
            problems.append(f"{name}: pinned {version}, installed {installed}")
    assert problems == []


def test_torch_is_the_cpu_build_of_the_pinned_version():
    assert pins(ROOT / "requirements.txt")["torch"] == "2.13.0"
    assert torch_build_problems("2.13.0") == []


def fake_torch_metadata(where: Path, version: str, requires: list[str]) -> None:
    """Metadata of another torch build, found before the installed one."""
    info = where / f"torch-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", "Name: torch", f"Version: {version}"]
    lines += [f"Requires-Dist: {spec}" for spec in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


NVIDIA = [
    'nvidia-cublas-cu12==12.8.4.1; platform_system == "Linux"',
    "nvidia-cudnn-cu12",
]


@pytest.mark.parametrize(
    ("version", "requires", "toolkit", "built"),
    [
        ("2.13.0", NVIDIA, "cuda", "12.8"),  # PyPI's Linux wheel: no label at all
        ("2.13.0+cu126", NVIDIA, "cuda", "12.6"),  # PyTorch's CUDA index
        ("2.13.0+rocm6.4", [], "hip", "6.4.1"),  # PyTorch's ROCm index
    ],
    ids=["pypi-cuda", "cuda-index", "rocm"],
)
@pytest.mark.parametrize(
    "check",
    [
        test_pins_match_what_is_installed,
        test_torch_is_the_cpu_build_of_the_pinned_version,
    ],
)
def test_a_gpu_build_of_the_pinned_torch_fails_the_pin_checks(
    tmp_path, monkeypatch, check, version, requires, toolkit, built
):
    import torch

    fake_torch_metadata(tmp_path, version, requires)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.version, toolkit, built)
    assert metadata.version("torch") == version  # the break is in place
    with pytest.raises(AssertionError):
        check()


# --- Binder ------------------------------------------------------------------------


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


# --- the pins resolve on the oldest Python 3.11 this machine has ----------------------


def python_version(python: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except OSError:
        return None
    return tuple(int(part) for part in out.split()) or None


def oldest_python_3_11() -> tuple[str, tuple[int, ...]]:
    """The oldest Python 3.11 on this machine: Debian 12's /usr/bin/python3.11 here and
    on CI, the system Python most readers of a Debian machine have."""
    import shutil

    candidates = {
        "/usr/bin/python3.11",
        "/usr/local/bin/python3.11",
        shutil.which("python3.11"),
        sys._base_executable,
    }
    found = {}
    for python in filter(None, candidates):
        version = python_version(python) if Path(python).exists() else None
        if version and version[:2] == (3, 11):
            found[python] = version
    assert found, "no Python 3.11 on this machine"
    python = min(found, key=found.get)
    return python, found[python]


@pytest.fixture(scope="module")
def oldest_env(tmp_path_factory):
    """An empty environment of the oldest Python 3.11, for pip's --python."""
    python, version = oldest_python_3_11()
    env = tmp_path_factory.mktemp("oldest") / "env"
    subprocess.run([python, "-m", "venv", "--without-pip", str(env)], check=True)
    return env / "bin" / "python", version


@pytest.fixture(scope="module")
def torch_stand_in(tmp_path_factory):
    """A wheel with the installed torch's own metadata (its Requires-Python and its
    dependencies) and nothing else, in a folder for pip's --find-links: resolving
    the pins then never downloads torch. Its local label sorts above the real
    wheel's, so pip prefers it for `torch==<pin>`."""
    folder = tmp_path_factory.mktemp("torch-stand-in")
    real = metadata.distribution("torch")
    version = real.version + (".stand.in" if "+" in real.version else "+stand.in")
    text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", real.read_text("METADATA"), count=1)
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/__init__.py", "")
        archive.writestr(f"{info}/METADATA", text)
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    return folder, version


class Resolution:
    """pip's dry run of some requirement files for the oldest Python, started at once
    (the three below run side by side: each mostly waits on the package index)."""

    def __init__(self, files: list[Path], oldest_env, torch_stand_in, folder: Path):
        python, self.version = oldest_env
        stand_in_folder, self.stand_in = torch_stand_in
        self.files, self.report = files, folder / "report.json"
        command = [sys.executable, "-m", "pip", "--python", str(python), "install"]
        command += ["--dry-run", "--ignore-installed", "--quiet", "--report", str(self.report)]
        command += ["--disable-pip-version-check", "--find-links", str(stand_in_folder)]
        for path in files:
            command += ["-r", str(path)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def problems(self) -> list[str]:
        """What is wrong ([] when the set resolves to exactly its pins, none yanked)."""
        _, stderr = self.process.communicate()
        where = f"on Python {'.'.join(map(str, self.version))}"
        if self.process.returncode != 0:
            return [f"the pins do not resolve {where}:\n{stderr[-3000:]}"]
        problems = [
            f"a yanked release is pinned {where}: {line}"
            for line in stderr.splitlines()
            if "yanked version" in line
        ]
        resolved = {
            canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(self.report.read_text())["install"]
        }
        pinned = {}
        for path in self.files:
            pinned |= pins(path)
        # Exactly the pins: nothing unpinned comes in on this Python, and torch's
        # metadata was read from the stand-in (no download of torch).
        expected = pinned | ({"torch": self.stand_in} if "torch" in pinned else {})
        if resolved != expected:
            problems.append(
                f"resolved {where} to other than the pins: "
                f"{sorted(set(resolved.items()) ^ set(expected.items()))}"
            )
        return problems


@pytest.fixture(scope="module")
def resolutions(oldest_env, torch_stand_in, tmp_path_factory):
    """Today's pins; the same pins with those that rejected 3.11.2 put back (the break
    the check must catch); and a small set with a yanked pin (another break)."""
    today = [ROOT / "requirements-dev.txt", ROOT / "requirements-lab.txt"]
    old = tmp_path_factory.mktemp("old-pins")
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-lab.txt"):
        text = (ROOT / name).read_text("utf-8")
        for package, version in PINS_THAT_REJECTED_3_11_2.items():
            text = re.sub(rf"(?im)^{package}==\S+", f"{package}=={version}", text)
        (old / name).write_text(text)
    # soupsieve 3.0.1 still says Requires-Python >=3.11, but it was yanked because
    # Python < 3.11.5 breaks it: no way out for 3.11.2.
    book = pins(ROOT / "requirements.txt")
    yanked = tmp_path_factory.mktemp("yanked")
    (yanked / "requirements.txt").write_text(
        f"beautifulsoup4=={book['beautifulsoup4']}\nsoupsieve==3.0.1\n"
        f"typing_extensions=={book['typing-extensions']}\n"
    )
    started = {
        "today": (today, tmp_path_factory.mktemp("today")),
        "old": ([old / "requirements-dev.txt", old / "requirements-lab.txt"], old),
        "yanked": ([yanked / "requirements.txt"], yanked),
    }
    return {
        name: Resolution(files, oldest_env, torch_stand_in, folder)
        for name, (files, folder) in started.items()
    }


def test_every_pin_resolves_on_the_oldest_python(resolutions):
    dev, lab = pins(ROOT / "requirements-dev.txt"), pins(ROOT / "requirements-lab.txt")
    assert {name for name in dev.keys() & lab.keys() if dev[name] != lab[name]} == set()
    assert resolutions["today"].problems() == []


def test_the_resolve_check_fails_on_the_pins_that_rejected_3_11_2(resolutions):
    old = resolutions["old"]
    assert old.version < (3, 11, 5), (
        f"the oldest Python 3.11 here is {old.version}: this check needs one older "
        "than 3.11.5, such as Debian 12's python3.11"
    )
    assert pins(old.files[0])["soupsieve"] == "4.1.3"  # the break is in place
    problems = old.problems()
    assert len(problems) == 1
    assert "soupsieve==4.1.3" in problems[0] and "Requires-Python" in problems[0]


def test_the_resolve_check_fails_on_a_yanked_pin(resolutions):
    problems = resolutions["yanked"].problems()
    assert len(problems) == 1 and "yanked" in problems[0] and "soupsieve" in problems[0]
