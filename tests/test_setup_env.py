"""scripts/setup-env: it stops clearly when a system tool or the right Python is missing,
and it takes torch's CPU build from PyTorch's CPU index when that index answers."""

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest
from test_pins import oldest_python_3_11, pins

import nbcheck


def run_without_dot(tmp_path, uid: str, profile: str = "book", tools=("bash", "dirname", "cat")):
    # A PATH with just what the script needs before its system checks: no `dot`
    # (unless asked for), no `apt-get`, no `chromium`, and an `id` that reports the
    # given user id.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in tools:
        os.symlink(shutil.which(tool), bindir / tool)
    (bindir / "id").write_text(f"#!{shutil.which('bash')}\necho {uid}\n")
    (bindir / "id").chmod(0o755)
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    result = subprocess.run(
        [str(bindir / "bash"), "scripts/setup-env", profile],
        cwd=repo,
        env={"PATH": str(bindir)},
        capture_output=True,
        text=True,
    )
    return result, repo


def test_missing_graphviz_as_user_stops_with_one_clear_line(tmp_path):
    result, repo = run_without_dot(tmp_path, uid="1000")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sudo apt-get install graphviz" in lines[0] and "brew install graphviz" in lines[0]
    assert not (repo / ".venv").exists(), "a half-made venv was left behind"


def test_missing_graphviz_as_root_without_apt_stops_the_same_way(tmp_path):
    result, repo = run_without_dot(tmp_path, uid="0")
    assert result.returncode != 0
    assert "apt-get install graphviz" in result.stderr
    assert not (repo / ".venv").exists()


def test_missing_chromium_for_the_tests_stops_with_one_clear_line(tmp_path):
    result, repo = run_without_dot(
        tmp_path, uid="1000", profile="dev", tools=("bash", "dirname", "cat", "dot")
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sudo apt-get install chromium" in lines[0] and "CHROMIUM=" in lines[0]
    assert not (repo / ".venv").exists()


def test_cache_is_dropped_when_the_helper_changes(tmp_path):
    # Jupyter Book's cache keys on a chapter's code only; the script covers the rest.
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    (repo / "src" / "gradstop").mkdir(parents=True)
    (repo / "src" / "gradstop" / "helper.py").write_text("A = 1\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\n")
    (repo / "pyproject.toml").write_text("[project]\n")
    script = [str(repo / "scripts" / "invalidate-stale-cache")]

    def build_leftovers():
        for name in (".jupyter_cache", ".doctrees"):
            (repo / "_build" / name).mkdir(parents=True, exist_ok=True)

    subprocess.run(script, check=True)
    build_leftovers()
    subprocess.run(script, check=True)  # nothing changed
    assert (repo / "_build" / ".jupyter_cache").exists()
    (repo / "src" / "gradstop" / "helper.py").write_text("A = 2\n")
    out = subprocess.run(script, check=True, capture_output=True, text=True).stdout
    assert "every chapter will re-run" in out
    assert not (repo / "_build" / ".jupyter_cache").exists()
    assert not (repo / "_build" / ".doctrees").exists()


def test_a_python_without_its_venv_module_stops_with_one_clear_line(tmp_path):
    # Debian and Ubuntu ship ensurepip in python3-venv, which a fresh system may lack.
    python, _ = oldest_python_3_11()
    hidden = tmp_path / "no-venv-module"
    (hidden / "ensurepip").mkdir(parents=True)
    (hidden / "ensurepip" / "__init__.py").write_text(
        "raise ImportError('as without python3-venv')\n"
    )
    fake = tmp_path / "python3.11"
    fake.write_text(f'#!/bin/sh\nPYTHONPATH={hidden} exec {python} "$@"\n')
    fake.chmod(0o755)
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    (repo / "requirements.txt").write_text(f"torch=={TORCH}\n")
    result = subprocess.run(
        ["scripts/setup-env", "book"],
        cwd=repo,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": str(fake)},
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no venv module" in lines[0] and "sudo apt-get install python3-venv" in lines[0]
    assert not (repo / ".venv").exists()


# --- torch: the CPU index when it answers, the default index otherwise ----------------
# Stand-ins on loopback for both indexes (PEP 503 simple indexes served from a temp
# folder), each with a tiny wheel that says where it came from; pip reads no config
# of this machine (PIP_CONFIG_FILE=/dev/null), so nothing else can answer.

TORCH = pins(nbcheck.ROOT / "requirements.txt")["torch"]


def tiny_torch(folder: Path, version: str, came_from: str, requires=()) -> None:
    """A one-file wheel named torch, as a PEP 503 project page in `folder`/torch/."""
    project = folder / "torch"
    project.mkdir(parents=True)
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    lines = ["Metadata-Version: 2.1", "Name: torch", f"Version: {version}"]
    lines += [f"Requires-Dist: {spec}" for spec in requires]
    with zipfile.ZipFile(project / name, "w") as wheel:
        wheel.writestr("torch/__init__.py", f"CAME_FROM = {came_from!r}\n")
        wheel.writestr(f"{info}/METADATA", "\n".join(lines) + "\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
        wheel.writestr(f"{info}/RECORD", "")
    href = name.replace("+", "%2B")
    (project / "index.html").write_text(f'<html><body><a href="{href}">{name}</a></body></html>')


@contextlib.contextmanager
def serve(folder: Path):
    """A package index on 127.0.0.1 serving `folder`; yields (url, paths requested)."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requested
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_index():
    """An address on 127.0.0.1 that accepts connections and never answers: an index
    that hangs. Yields (url, connections so far)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    held, stop = [], threading.Event()

    def hold():
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/", held
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


@pytest.fixture(scope="module")
def template_venv(tmp_path_factory):
    """One venv (with pip) of the oldest Python 3.11 here, copied into each repository
    copy below: venv creation is the slow part, and setup-env reuses a marked venv."""
    python, _ = oldest_python_3_11()
    venv = tmp_path_factory.mktemp("template") / ".venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    return venv


def repo_with_pins(tmp_path: Path, template_venv: Path, requirements: str) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(nbcheck.ROOT / "scripts", repo / "scripts")
    (repo / "requirements.txt").write_text(requirements)
    shutil.copytree(template_venv, repo / ".venv", symlinks=True)
    (repo / ".venv" / ".created").touch()
    return repo


def setup_env(repo: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        **env,
    }
    return subprocess.run(
        ["scripts/setup-env", "book"],
        cwd=repo,
        env=environment,
        capture_output=True,
        text=True,
    )


def installed_torch(repo: Path) -> tuple[str, str]:
    out = subprocess.run(
        [
            str(repo / ".venv" / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, torch; print(m.version('torch'), torch.CAME_FROM)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version, came_from = out.split()
    return version, came_from


def torch_line(result) -> str:
    lines = [line for line in result.stdout.splitlines() if "torch" in line]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0]


@pytest.fixture
def indexes(tmp_path):
    """(CPU stand-in folder, default stand-in folder): the CPU index has the +cpu
    build; the default one a build that, like PyPI's Linux wheel, names NVIDIA
    libraries (behind an extra, so that this tiny wheel installs alone)."""
    cpu, default = tmp_path / "cpu-index", tmp_path / "default-index"
    tiny_torch(cpu, f"{TORCH}+cpu", "cpu-index")
    tiny_torch(default, TORCH, "default-index", ['nvidia-cublas-cu12; extra == "never"'])
    return cpu, default


def break_probe(repo: Path, answer: int) -> None:
    """A deliberate break: setup-env's probe of the CPU index always says `answer`
    (0: "it answered", 1: "it did not") without asking."""
    script = repo / "scripts" / "setup-env"
    text = script.read_text()
    probe = "index_answers() {\n"
    assert probe in text
    script.write_text(text.replace(probe, f"{probe}  return {answer}\n", 1))


def cpu_index_problems(tmp_path, template_venv, indexes, broken=None) -> list[str]:
    """With a CPU index that answers: what setup-env did wrong ([] when torch came from
    it, saying so in one line, and the default index served no torch)."""
    repo = repo_with_pins(tmp_path, template_venv, f"torch=={TORCH}\n")
    if broken is not None:
        break_probe(repo, broken)
    with serve(indexes[0]) as (cpu_url, _), serve(indexes[1]) as (url, asked):
        result = setup_env(repo, TORCH_CPU_INDEX=cpu_url, PIP_INDEX_URL=url)
    assert result.returncode == 0, result.stdout + result.stderr
    said = (
        f"setup-env: torch {TORCH} from PyTorch's CPU index ({cpu_url}): "
        "the CPU build, about 190 MB to download"
    )
    problems = [] if torch_line(result) == said else [f"said {torch_line(result)!r}"]
    if installed_torch(repo) != (f"{TORCH}+cpu", "cpu-index"):
        problems.append(f"installed {installed_torch(repo)}")
    problems += [f"the default index served {path}" for path in asked if path.endswith(".whl")]
    return problems


def test_torch_comes_from_the_cpu_index_when_it_answers(tmp_path, template_venv, indexes):
    assert cpu_index_problems(tmp_path, template_venv, indexes) == []


def test_the_cpu_index_check_fails_when_the_index_is_never_used(tmp_path, template_venv, indexes):
    problems = cpu_index_problems(tmp_path, template_venv, indexes, broken=1)
    assert any("the default index served" in problem for problem in problems), problems


def hanging_index_problems(tmp_path, template_venv, indexes, broken=None) -> list[str]:
    """With a CPU index that accepts connections and never answers: what setup-env did
    wrong ([] when it probed once, gave up after its deadline, said so, and took torch
    from the default index). pip's own time-out and retries are cut to 1 s and 1 here,
    so that a break shows in seconds (this machine's default: 180 s, 5 retries)."""
    repo = repo_with_pins(tmp_path, template_venv, f"torch=={TORCH}\n")
    if broken is not None:
        break_probe(repo, broken)
    with silent_index() as (cpu_url, connections), serve(indexes[1]) as (url, _):
        result = setup_env(
            repo,
            TORCH_CPU_INDEX=cpu_url,
            TORCH_INDEX_WAIT="2",
            PIP_INDEX_URL=url,
            PIP_DEFAULT_TIMEOUT="1",
            PIP_RETRIES="1",
        )
        probes = len(connections)
    assert result.returncode == 0, result.stdout + result.stderr
    problems = []
    # One connection: setup-env's own probe, given up after its deadline. pip is never
    # handed the silent index, so none of its time-outs and retries happen.
    if probes != 1:
        problems.append(f"{probes} connections to the silent index")
    said = (
        "setup-env: PyTorch's CPU index did not answer within 2 s; "
        f"torch {TORCH} from the default index: the CUDA build, "
        "about 0.5 GB plus several GB of NVIDIA libraries to download"
    )
    lines = [line for line in result.stdout.splitlines() if "torch" in line]
    if lines != [said]:
        problems.append(f"said {lines!r}")
    if installed_torch(repo) != (TORCH, "default-index"):
        problems.append(f"installed {installed_torch(repo)}")
    return problems


def test_a_cpu_index_that_hangs_costs_one_probe_then_the_default_index(
    tmp_path, template_venv, indexes
):
    assert hanging_index_problems(tmp_path, template_venv, indexes) == []


def test_the_hanging_index_check_fails_when_pip_is_handed_the_index(
    tmp_path, template_venv, indexes
):
    problems = hanging_index_problems(tmp_path, template_venv, indexes, broken=0)
    assert any("connections to the silent index" in problem for problem in problems), problems


def test_macos_and_windows_take_the_default_wheels_without_asking(tmp_path, template_venv, indexes):
    repo = repo_with_pins(tmp_path, template_venv, f"torch=={TORCH}\n")
    default = tmp_path / "mac-default-index"
    tiny_torch(default, TORCH, "default-index")
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "uname").write_text(
        '#!/bin/sh\ncase "$1" in -s) echo Darwin ;; -m) echo arm64 ;; *) echo Darwin ;; esac\n'
    )
    (fake / "uname").chmod(0o755)
    with serve(indexes[0]) as (cpu_url, cpu_asked), serve(default) as (url, _):
        result = setup_env(
            repo,
            TORCH_CPU_INDEX=cpu_url,
            PIP_INDEX_URL=url,
            PATH=f"{fake}:{os.environ['PATH']}",
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert cpu_asked == []
    assert torch_line(result) == (
        f"setup-env: torch {TORCH} from the default index: a CPU build, "
        "about 100-200 MB to download"
    )
    assert installed_torch(repo) == (TORCH, "default-index")


# --- every pin's Requires-Python is checked before anything is installed --------------


def test_a_pin_that_rejects_this_python_stops_with_one_line(tmp_path, template_venv):
    # soupsieve 4.1.3 needs Python >= 3.11.5 (issue 20): on Debian 12's 3.11.2 the
    # check must name it, the interpreter and what to do, before installing anything.
    python, version = oldest_python_3_11()
    assert version < (3, 11, 5), f"needs a Python 3.11 older than 3.11.5; the oldest is {version}"
    repo = repo_with_pins(tmp_path, template_venv, "soupsieve==4.1.3\n")
    machine = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    result = subprocess.run(
        ["scripts/setup-env", "book"],
        cwd=repo,
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/"),
            **machine,
        },
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("setup-env: soupsieve==4.1.3 needs Python >=3.11.5"), lines[0]
    assert f"({'.'.join(map(str, version))})" in lines[0] and "PYTHON=" in lines[0]
    assert "soupsieve" not in installed_names(repo)
    assert not (repo / ".venv" / ".created").exists(), "the next run would reuse this venv"


def installed_names(repo: Path) -> set[str]:
    out = subprocess.run(
        [
            str(repo / ".venv" / "bin" / "python"),
            "-m",
            "pip",
            "list",
            "--format=freeze",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("==")[0].lower() for line in out.splitlines()}
