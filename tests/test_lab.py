"""`make lab` starts JupyterLab for every reader: as root (containers, CI) and as a user."""

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

import nbcheck

ROOT = nbcheck.ROOT
CHAPTER = "01-autograd-graph.ipynb"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def jupyter_env(tmp_path: Path) -> dict:
    """This machine's environment, with Jupyter's own files kept in ``tmp_path``."""
    return {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
    }


def wait_until_up(url: str, server: subprocess.Popen, log: Path, seconds: int = 600) -> None:
    # The first `make lab` installs JupyterLab's pins into .venv: allow for it.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, f"make lab exited:\n{log.read_text()[-3000:]}"
        try:
            if requests.get(url, timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(1)
    raise AssertionError(f"JupyterLab did not answer in {seconds} s:\n{log.read_text()[-3000:]}")


def stop(server: subprocess.Popen, base: str, token: str) -> None:
    """Ask the server to shut down; end the process group we started if it does not."""
    try:
        requests.post(f"{base}/api/shutdown", params={"token": token}, timeout=5)
        server.wait(timeout=30)
    except (requests.RequestException, subprocess.TimeoutExpired):
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_make_lab_serves_a_chapter_and_stops(tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    base = f"http://127.0.0.1:{port}"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            ["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"],
            cwd=ROOT,
            env=jupyter_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so that stop() can end it
        )
    try:
        wait_until_up(f"{base}/api/status?token={token}", server, log)
        chapter = requests.get(
            f"{base}/api/contents/{CHAPTER}", params={"token": token}, timeout=30
        )
        assert chapter.ok and chapter.json()["type"] == "notebook"
        cells = chapter.json()["content"]["cells"]
        assert any("import gradstop as gp" in c["source"] for c in cells)
        assert requests.get(f"{base}/api/contents/{CHAPTER}", timeout=30).status_code == 403
    finally:
        stop(server, base, token)
    said_root = "JupyterLab starts with --allow-root" in log.read_text()
    assert said_root == (os.getuid() == 0), log.read_text()[-2000:]


@pytest.mark.parametrize("uid", ["0", "1000"])
def test_make_lab_adds_allow_root_exactly_for_root(tmp_path, uid):
    # Stand-ins: `id` reports the user; `jupyter` prints how it was started.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (fake / "jupyter").write_text('#!/bin/sh\necho "jupyter $*"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    env = {**jupyter_env(tmp_path), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["make", "--no-print-directory", "lab", f"BIN={fake}", "LAB_ARGS=--no-browser"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (started,) = [line for line in result.stdout.splitlines() if line.startswith("jupyter ")]
    assert started.split()[1:3] == ["lab", "notebooks/"]
    assert ("--allow-root" in started.split()) == (uid == "0")
    assert started.split()[-1] == "--no-browser"
